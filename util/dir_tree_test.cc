// The descriptor-based removal on real files: links planted in a tree are removed themselves and
// never followed, and an entry is removed relative to its parent's descriptor even after the path
// that led to that parent has been swapped for a link.
#include "util/dir_tree.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace ftd::util {
namespace {

namespace fs = std::filesystem;

class DirTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ftd-dir-tree-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  void Write(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
  }
  fs::path dir_;
};

TEST_F(DirTreeTest, AnEntryIsRemovedWithItsTreeAndItsBytesCounted) {
  Write(dir_ / "cache" / "k" / "ids.u32", std::string(12, 'i'));
  Write(dir_ / "cache" / "k" / "sub" / "meta.json", std::string(30, 'm'));
  const int fd = ::open((dir_ / "cache").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  int64_t bytes = 0;
  EXPECT_TRUE(RemoveEntryAt(fd, "k", "cache/k", &bytes).ok());
  EXPECT_EQ(bytes, 42);
  EXPECT_FALSE(fs::exists(dir_ / "cache" / "k"));
  EXPECT_TRUE(RemoveEntryAt(fd, "k", "cache/k", &bytes).ok()) << "a missing entry is no error";
  ::close(fd);
}

TEST_F(DirTreeTest, LinksAreRemovedThemselvesAndNeverFollowed) {
  Write(dir_ / "outside" / "d" / "kept", "kept");
  Write(dir_ / "outside" / "secret", "secret");
  Write(dir_ / "cache" / "k" / "meta.json", "{}");
  fs::create_directory_symlink(dir_ / "outside" / "d", dir_ / "cache" / "k" / "dir-link");
  fs::create_symlink(dir_ / "outside" / "secret", dir_ / "cache" / "k" / "file-link");
  fs::create_directory_symlink(dir_ / "outside" / "d", dir_ / "cache" / "entry-link");
  const int fd = ::open((dir_ / "cache").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  int64_t bytes = 0;
  EXPECT_TRUE(RemoveEntryAt(fd, "k", "cache/k", &bytes).ok());
  EXPECT_TRUE(RemoveEntryAt(fd, "entry-link", "cache/entry-link", &bytes).ok());
  ::close(fd);
  EXPECT_EQ(bytes, 2) << "meta.json's bytes; links free none";
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir_ / "cache" / "k")));
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir_ / "cache" / "entry-link")));
  EXPECT_TRUE(fs::is_regular_file(dir_ / "outside" / "d" / "kept"));
  EXPECT_TRUE(fs::is_regular_file(dir_ / "outside" / "secret"));
}

// The cache's own directory is opened once; its path is then swapped for a link to a directory that
// holds an entry of the same name. The removal goes on beneath the opened directory: the entry in
// the moved-away cache goes, the one the link leads to stays.
TEST_F(DirTreeTest, TheRemovalStaysBeneathTheOpenedDirectoryWhenItsPathIsSwapped) {
  Write(dir_ / "cache" / "k" / "ids.u32", "ours");
  Write(dir_ / "victim" / "k" / "ids.u32", "theirs");
  const int fd = ::open((dir_ / "cache").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  fs::rename(dir_ / "cache", dir_ / "moved");
  fs::create_directory_symlink(dir_ / "victim", dir_ / "cache");
  int64_t bytes = 0;
  EXPECT_TRUE(RemoveEntryAt(fd, "k", "cache/k", &bytes).ok());
  ::close(fd);
  EXPECT_FALSE(fs::exists(dir_ / "moved" / "k"));
  EXPECT_TRUE(fs::is_regular_file(dir_ / "victim" / "k" / "ids.u32"));
}

TEST_F(DirTreeTest, RemoveTreeOfALinkRemovesTheLinkOnly) {
  Write(dir_ / "outside" / "kept", "kept");
  fs::create_directory_symlink(dir_ / "outside", dir_ / "tree");
  EXPECT_EQ(RemoveTree((dir_ / "tree").string()).value(), 0);
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir_ / "tree")));
  EXPECT_TRUE(fs::is_regular_file(dir_ / "outside" / "kept"));
  EXPECT_EQ(RemoveTree((dir_ / "nothing").string()).value(), 0);
}

}  // namespace
}  // namespace ftd::util

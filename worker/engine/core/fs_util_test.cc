#include "worker/engine/core/fs_util.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace ftd::engine {
namespace {

namespace fs = std::filesystem;

class FsUtilTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ftd-fs-util-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(FsUtilTest, RegularFileIsReadAndItsDescriptorBlocks) {
  const std::string path = (dir_ / "a.txt").string();
  ASSERT_TRUE(WriteFileSynced(path, "hello").ok());
  auto text = ReadRegularFile(path, "spec.x");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "hello");
  auto fd = OpenRegularFile(path, "spec.x");
  ASSERT_TRUE(fd.ok());
  const int flags = ::fcntl(fd->get(), F_GETFL);
  EXPECT_EQ(flags & O_NONBLOCK, 0);
  EXPECT_NE(::fcntl(fd->get(), F_GETFD) & FD_CLOEXEC, 0);
}

TEST_F(FsUtilTest, FifoIsRefusedWithoutBlocking) {
  const std::string path = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  // No writer: a blocking open would wait forever.
  auto fd = OpenRegularFile(path, "spec.data.path");
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fd.status().message(), "spec.data.path: " + path + " is a FIFO, not a regular file (give a regular file)");
  EXPECT_FALSE(ReadRegularFile(path, "spec.data.path").ok());
}

TEST_F(FsUtilTest, DirectoryAndDevicesAreRefusedNamingTheKind) {
  auto d = OpenRegularFile(dir_.string(), "spec.model.config_path");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("spec.model.config_path: " + dir_.string() + " is a directory, not a regular file"),
            std::string::npos);
  auto dev = OpenRegularFile("/dev/null", "");
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().message(), "/dev/null is a character device, not a regular file (give a regular file)");
}

TEST_F(FsUtilTest, MissingFileIsNotFound) {
  auto fd = OpenRegularFile((dir_ / "nope").string(), "spec.data.path");
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(fd.status().message().find("spec.data.path: cannot open "), std::string::npos);
}

TEST_F(FsUtilTest, DirLockExcludesOthersUntilReleased) {
  auto other = [&] {
    const int fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const int rc = ::flock(fd, LOCK_EX | LOCK_NB);
    ::close(fd);
    return rc;
  };
  {
    auto lock = DirLock::Acquire(dir_.string());
    ASSERT_TRUE(lock.ok()) << lock.status();
    EXPECT_EQ(other(), -1);  // flock locks belong to the open file: another open of the directory waits
    EXPECT_EQ(errno, EWOULDBLOCK);
  }
  EXPECT_EQ(other(), 0);
}

// Confinement, through openat2 and through the O_NOFOLLOW walk that stands in for it.
class ConfinedOpenTest : public FsUtilTest, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    FsUtilTest::SetUp();
    dir_ = fs::canonical(dir_);
    ForceOpenWalkForTesting(GetParam());
    fs::create_directories(dir_ / "root" / "data");
    fs::create_directories(dir_ / "out");
    { std::ofstream(dir_ / "root" / "data" / "t.bin") << "tokens"; }
    { std::ofstream(dir_ / "out" / "secret") << "secret"; }
    ASSERT_TRUE(ConfineOpens({{(dir_ / "root").string(), true}}).ok());
  }
  void TearDown() override {
    ASSERT_TRUE(ConfineOpens({}).ok());
    ForceOpenWalkForTesting(false);
    FsUtilTest::TearDown();
  }
};

TEST_P(ConfinedOpenTest, OpensBeneathTheRootAndRefusesWaysOut) {
  auto in = ReadRegularFile((dir_ / "root/data/t.bin").string(), "spec.data.path");
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(*in, "tokens");
  // a path under no root
  auto out = ReadRegularFile((dir_ / "out/secret").string(), "spec.data.path");
  EXPECT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("spec.data.path: not permitted"), std::string::npos) << out.status();
  // the file swapped for a symbolic link out, and a directory on the way swapped for one
  fs::remove(dir_ / "root/data/t.bin");
  fs::create_symlink(dir_ / "out/secret", dir_ / "root/data/t.bin");
  out = ReadRegularFile((dir_ / "root/data/t.bin").string(), "spec.data.path");
  EXPECT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("not permitted"), std::string::npos) << out.status();
  fs::remove_all(dir_ / "root/data");
  fs::create_symlink("../out", dir_ / "root/data");
  out = ReadRegularFile((dir_ / "root/data/secret").string(), "spec.data.path");
  EXPECT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("not permitted"), std::string::npos) << out.status();
}

TEST_P(ConfinedOpenTest, WritesAndDirectoriesOnlyBeneathAWritableRoot) {
  EXPECT_TRUE(EnsureDirectory((dir_ / "root/ck/a").string(), "spec.checkpoint.dir").ok());
  EXPECT_TRUE(fs::is_directory(dir_ / "root/ck/a"));
  EXPECT_TRUE(WriteFileSynced((dir_ / "root/ck/a/m.json").string(), "{}").ok());
  fs::create_symlink(dir_ / "out", dir_ / "root/ck/link");
  auto st = EnsureDirectory((dir_ / "root/ck/link/x").string(), "spec.checkpoint.dir");
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_FALSE(fs::exists(dir_ / "out/x"));
  EXPECT_FALSE(WriteFileSynced((dir_ / "root/ck/link/m.json").string(), "{}").ok());
  EXPECT_FALSE(fs::exists(dir_ / "out/m.json"));
  ASSERT_TRUE(ConfineOpens({{(dir_ / "root").string(), false}}).ok());  // read-only now
  EXPECT_FALSE(WriteFileSynced((dir_ / "root/ck/a/n.json").string(), "{}").ok());
}

INSTANTIATE_TEST_SUITE_P(Openat2AndWalk, ConfinedOpenTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "walk" : "openat2"; });

}  // namespace
}  // namespace ftd::engine

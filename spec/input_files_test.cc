#include "spec/input_files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace ftd::spec {
namespace {

namespace fs = std::filesystem;

class InputFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("input_files_test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream(dir_ / "tokens.bin") << "xx";
    ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0600), 0);
    fs::create_directories(dir_ / "weights");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const char* name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(InputFiles, AFifoAsDataIsRefusedNamingTheField) {
  TrainConfig c;
  c.data.path = P("fifo");
  const auto st = CheckInputFiles(c);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("spec.data.path"), std::string::npos) << st;
  EXPECT_NE(st.message().find("is a FIFO; it must be a regular file"), std::string::npos) << st;
}

TEST_F(InputFiles, DevicesAndDirectoriesWhereAFileIsExpectedAreRefused) {
  TrainConfig c;
  c.data.path = "/dev/null";
  EXPECT_NE(CheckInputFiles(c).message().find("a character device"), std::string::npos);
  c.data.path = P("weights");
  EXPECT_NE(CheckInputFiles(c).message().find("spec.data.path"), std::string::npos);
  c.data.path = P("tokens.bin");
  c.model.config_path = P("fifo");
  EXPECT_NE(CheckInputFiles(c).message().find("spec.model.config_path"), std::string::npos);
  c.model.config_path = P("weights");  // a directory holding config.json is fine
  c.model.weights_path = P("tokens.bin");
  EXPECT_NE(CheckInputFiles(c).message().find("spec.model.weights_path"), std::string::npos);
  c.model.weights_path = P("weights");
  c.lora.adapter_path = P("fifo");
  EXPECT_NE(CheckInputFiles(c).message().find("spec.lora.adapter_path"), std::string::npos);
  c.lora.adapter_path = "";
  c.checkpoint.dir = P("tokens.bin");
  EXPECT_NE(CheckInputFiles(c).message().find("spec.checkpoint.dir"), std::string::npos);
  c.checkpoint.dir = "";
  c.data.eval_path = P("fifo");
  EXPECT_NE(CheckInputFiles(c).message().find("spec.data.eval_path"), std::string::npos);
  c.data.eval_path = "";
  c.data.tokenizer_path = P("tokens.bin");
  EXPECT_NE(CheckInputFiles(c).message().find("spec.data.tokenizer_path"), std::string::npos);
  c.data.tokenizer_path = "";
  c.data.cache_dir = P("tokens.bin");
  EXPECT_NE(CheckInputFiles(c).message().find("spec.data.cache_dir"), std::string::npos);
}

TEST_F(InputFiles, RightTypesMissingOutputsAndRelativePathsPass) {
  TrainConfig c;
  EXPECT_TRUE(CheckInputFiles(c).ok());  // no paths at all
  c.data.path = P("tokens.bin");
  c.model.config_path = P("tokens.bin");
  c.model.weights_path = P("weights");
  c.checkpoint.dir = P("not-yet");  // outputs are made by the worker
  c.data.cache_dir = P("not-yet/cache");
  EXPECT_TRUE(CheckInputFiles(c).ok()) << CheckInputFiles(c);
  c.data.path = "fifo";  // relative: resolved where the worker runs
  EXPECT_TRUE(CheckInputFiles(c).ok());
}

TEST_F(InputFiles, AMissingInputIsRefusedNamingTheFieldAndThePath) {
  // Accepted, it would fail the job only once it left the queue.
  TrainConfig c;
  c.data.path = P("missing.bin");
  auto st = CheckInputFiles(c);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(absl::StrCat("spec.data.path \"", P("missing.bin"), "\" does not exist; give an "
                                           "existing file")),
            std::string::npos)
      << st;
  c.data.path = P("tokens.bin/under-a-file.bin");  // ENOTDIR
  EXPECT_NE(CheckInputFiles(c).message().find("spec.data.path"), std::string::npos);
  c.data.path = P("tokens.bin");
  c.model.weights_path = P("no-weights");
  st = CheckInputFiles(c);
  EXPECT_NE(st.message().find("spec.model.weights_path"), std::string::npos) << st;
  EXPECT_NE(st.message().find("give an existing directory"), std::string::npos) << st;
  c.model.weights_path = "";
  for (std::string* field : {&c.data.eval_path, &c.data.tokenizer_path, &c.model.config_path, &c.lora.adapter_path}) {
    *field = P("gone");
    EXPECT_NE(CheckInputFiles(c).message().find("does not exist"), std::string::npos);
    *field = "";
  }
}

TEST_F(InputFiles, ALongPathIsNotEchoedWhole) {
  TrainConfig c;
  std::string dots;
  for (int i = 0; i < 1500; ++i) dots += "./";
  c.data.path = dir_.string() + "/" + dots + "fifo";
  const auto st = CheckInputFiles(c);
  ASSERT_FALSE(st.ok());
  EXPECT_LT(st.message().size(), 400u) << st.message().size();
  EXPECT_NE(st.message().find(absl::StrCat(c.data.path.size(), " bytes")), std::string::npos) << st;
}

// A local user's job whose workers run with other rights (root's, with no roots configured) may
// name only what its owner could use: by the files' modes, as the kernel would judge the owner.
TEST_F(InputFiles, AUserMayNameOnlyWhatTheyCouldUseThemself) {
  const FileUser alice{"alice", 54321, 54321, {54321}};
  const fs::path open = dir_ / "open", closed = dir_ / "closed";
  fs::create_directories(open / "ckpt");
  fs::create_directories(closed);
  ::chmod(dir_.c_str(), 0755);
  ::chmod(open.c_str(), 0755);
  ::chmod((open / "ckpt").c_str(), 0755);
  ::chmod(closed.c_str(), 0700);
  for (const fs::path& f : {open / "public.bin", open / "private.bin", closed / "public.bin"}) {
    std::ofstream(f) << "ab";
    ::chmod(f.c_str(), f.filename() == "private.bin" ? 0600 : 0644);
  }
  // The test runs as some other user than "alice" (root on CI): only the "others" bits are hers.
  ASSERT_NE(::getuid(), alice.uid);
  TrainConfig c;
  c.data.path = (open / "public.bin").string();
  EXPECT_TRUE(CheckUserMayUse(c, alice).ok()) << CheckUserMayUse(c, alice);
  c.data.path = (open / "private.bin").string();
  auto st = CheckUserMayUse(c, alice);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(std::string(st.message()).starts_with(absl::StrCat(
      "spec.data.path: permission denied: alice (uid 54321) may not read \"", c.data.path, "\"")))
      << st;
  // A directory on the way she may not search: refused whether or not the file exists.
  for (const char* name : {"public.bin", "no-such.bin"}) {
    c.data.path = (closed / name).string();
    st = CheckUserMayUse(c, alice);
    EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << name;
    EXPECT_NE(st.message().find("may not reach"), std::string::npos) << st;
  }
  // An output where she may not write, existing or to be made.
  c.data.path = (open / "public.bin").string();
  for (const fs::path& out : {open / "ckpt", open / "ckpt" / "new" / "deeper"}) {
    c.checkpoint.dir = out.string();
    st = CheckUserMayUse(c, alice);
    EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << out;
    EXPECT_NE(st.message().find("spec.checkpoint.dir: permission denied: alice (uid 54321) may not write"),
              std::string::npos)
        << st;
  }
  ::chmod((open / "ckpt").c_str(), 0777);
  EXPECT_TRUE(CheckUserMayUse(c, alice).ok()) << CheckUserMayUse(c, alice);
  // Her group's bits count for her groups.
  c.checkpoint.dir.clear();
  c.data.path = (open / "private.bin").string();
  ::chmod(c.data.path.c_str(), 0640);
  const FileUser in_group{"alice", 54321, 54321, {54321, ::getgid()}};
  EXPECT_TRUE(CheckUserMayUse(c, in_group).ok());
  EXPECT_FALSE(CheckUserMayUse(c, alice).ok());
  // Relative paths are the worker's to check.
  c.data.path = "relative.bin";
  EXPECT_TRUE(CheckUserMayUse(c, alice).ok());
}

}  // namespace
}  // namespace ftd::spec

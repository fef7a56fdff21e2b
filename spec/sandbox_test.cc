#include "spec/sandbox.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace ftd::spec {
namespace {

namespace fs = std::filesystem;

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ftd-sandbox-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    base_ = fs::canonical(tmpl);
    fs::create_directories(base_ / "users" / "alice" / "data");
    fs::create_directories(base_ / "users" / "bob" / "ckpt");
    fs::create_directories(base_ / "models" / "m");
    std::ofstream(base_ / "users" / "alice" / "data" / "train.bin") << "xx";
    std::ofstream(base_ / "outside.bin") << "secret";
    fs::create_symlink(base_ / "outside.bin", base_ / "users" / "alice" / "link.bin");
    fs::create_symlink("../bob", base_ / "users" / "alice" / "to-bob");
    cfg_.user_root = (base_ / "users" / "{user}").string();
    cfg_.read_only_roots = {(base_ / "models").string()};
    ASSERT_TRUE(cfg_.Validate().ok());
    auto r = cfg_.RootsFor("alice");
    ASSERT_TRUE(r.ok()) << r.status();
    alice_ = *r;
  }
  void TearDown() override { fs::remove_all(base_); }

  absl::Status Confine(const std::string& field, const std::string& value, ftd::v1::TrainSpec* out = nullptr) {
    ftd::v1::TrainSpec s;
    if (field == "checkpoint.dir") s.mutable_checkpoint()->set_dir(value);
    if (field == "data.path") s.mutable_data()->set_path(value);
    if (field == "data.cache_dir") s.mutable_data()->set_cache_dir(value);
    if (field == "model.weights_path") s.mutable_model()->set_weights_path(value);
    auto st = ConfineSpecPaths(alice_, &s);
    if (out != nullptr) *out = s;
    return st;
  }

  fs::path base_;
  SandboxConfig cfg_;
  Roots alice_;
};

TEST_F(SandboxTest, PathsInsideTheRootsAreResolvedAndKept) {
  ftd::v1::TrainSpec s;
  ASSERT_TRUE(Confine("checkpoint.dir", "runs/../ckpt", &s).ok());
  EXPECT_EQ(s.checkpoint().dir(), (base_ / "users/alice/ckpt").string());  // relative: against the user's root
  ASSERT_TRUE(Confine("data.path", "data/train.bin", &s).ok());
  EXPECT_EQ(s.data().path(), (base_ / "users/alice/data/train.bin").string());
  EXPECT_TRUE(Confine("model.weights_path", (base_ / "models/m").string()).ok());  // a shared read-only root
}

TEST_F(SandboxTest, AnOutputOutsideTheUsersRootIsDeniedNamingTheField) {
  auto st = Confine("checkpoint.dir", "/etc/x");
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(st.message().rfind("spec.checkpoint.dir: not permitted", 0), 0u) << st;
  // a read-only root is no place for outputs
  st = Confine("data.cache_dir", (base_ / "models/cache").string());
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_NE(st.message().find("may write"), std::string::npos) << st;
}

TEST_F(SandboxTest, DotDotAndSymlinksOutAreDenied) {
  EXPECT_EQ(Confine("checkpoint.dir", "../../x").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Confine("checkpoint.dir", "../bob/ckpt").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Confine("checkpoint.dir", "to-bob/ckpt").code(), absl::StatusCode::kPermissionDenied);
  // a missing directory, then `..` back into a symbolic link that leads out
  EXPECT_EQ(Confine("checkpoint.dir", "new/../to-bob/ckpt").code(), absl::StatusCode::kPermissionDenied);
  auto st = Confine("data.path", "link.bin");
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(st.message().find("symbolic links"), std::string::npos) << st;
  EXPECT_EQ(st.message().find("outside.bin"), std::string::npos) << "the link's target is not told: " << st;
}

TEST_F(SandboxTest, AMissingInputIsRefusedAndAMissingOutputIsNot) {
  auto st = Confine("data.path", "data/nope.bin");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("spec.data.path"), std::string::npos);
  EXPECT_NE(st.message().find("does not exist"), std::string::npos) << st;
  EXPECT_TRUE(Confine("checkpoint.dir", "new/run1").ok());
}

TEST_F(SandboxTest, BadConfigAndUserNames) {
  SandboxConfig c;
  c.user_root = "srv/{user}";
  EXPECT_FALSE(c.Validate().ok());
  c.user_root = "/srv/users";
  EXPECT_FALSE(c.Validate().ok());
  c.user_root = "/srv/{user}";
  c.read_only_roots = {(base_ / "nope").string()};
  EXPECT_FALSE(c.Validate().ok());
  EXPECT_FALSE(cfg_.RootsFor("..").ok());
  EXPECT_FALSE(cfg_.RootsFor("a/b").ok());
}

TEST(Beneath, ComparesWholeComponents) {
  EXPECT_TRUE(Beneath("/srv/a", "/srv/a"));
  EXPECT_TRUE(Beneath("/srv/a/b", "/srv/a"));
  EXPECT_FALSE(Beneath("/srv/ab", "/srv/a"));
  EXPECT_FALSE(Beneath("/srv", "/srv/a"));
}

}  // namespace
}  // namespace ftd::spec

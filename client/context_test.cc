#include "client/context.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ftd::client {
namespace {

namespace fs = std::filesystem;

GlobalFlags Flags(const std::string& addr, double timeout_s, const std::string& context) {
  GlobalFlags f;
  f.addr = addr;
  f.timeout_s = timeout_s;
  f.context = context;
  return f;
}

std::string Norm(const std::string& a) {
  auto r = NormalizeAddress(a);
  return r.ok() ? *r : "error: " + std::string(r.status().message());
}

TEST(Address, HostWithoutPortGetsFtdsDefaultPort) {
  EXPECT_EQ(Norm("localhost"), "localhost:7070");
  EXPECT_EQ(Norm("gpu-box.lan"), "gpu-box.lan:7070");
  EXPECT_EQ(Norm("10.0.0.7"), "10.0.0.7:7070");
  EXPECT_EQ(Norm("[::1]"), "[::1]:7070");
  EXPECT_EQ(Norm("::1"), "[::1]:7070");
  EXPECT_EQ(Norm("fe80::1:2"), "[fe80::1:2]:7070");
}

TEST(Address, PortsAndSchemesPassThrough) {
  EXPECT_EQ(Norm("localhost:7171"), "localhost:7171");
  EXPECT_EQ(Norm("[::1]:9000"), "[::1]:9000");
  EXPECT_EQ(Norm("unix:/run/ftd/ftd.sock"), "unix:/run/ftd/ftd.sock");
  EXPECT_EQ(Norm("unix-abstract:ftd"), "unix-abstract:ftd");
  EXPECT_EQ(Norm("dns:///gpu-box:7070"), "dns:///gpu-box:7070");
}

TEST(Address, BadOnesAreRefusedWithAnExample) {
  for (const char* a : {"", "host:", "host:http", "host:70000", "host:0", ":7070", "[::1", "[::1]x"}) {
    auto r = NormalizeAddress(a);
    ASSERT_FALSE(r.ok()) << a;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << a;
    EXPECT_NE(r.status().message().find("e.g. localhost"), std::string::npos) << r.status().message();
  }
}

class ResolveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("ftctl-context-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    setenv("FTCTL_CONFIG", (dir_ / "ftctl.json").c_str(), 1);
    WriteConfig("{}");
    unsetenv("FTD_ADDR");
    unsetenv("FTD_CONTEXT");
    unsetenv("FTD_TOKEN_FILE");
    // No local daemon to find: a home and a current directory of the test's own.
    old_cwd_ = std::filesystem::current_path();
    if (const char* h = getenv("HOME")) old_home_ = h;
    setenv("HOME", dir_.c_str(), 1);
    unsetenv("XDG_STATE_HOME");
    std::filesystem::current_path(dir_);
  }
  void TearDown() override {
    unsetenv("FTCTL_CONFIG");
    unsetenv("FTD_ADDR");
    std::filesystem::current_path(old_cwd_);
    setenv("HOME", old_home_.c_str(), 1);
    std::filesystem::remove_all(dir_);
  }
  void WriteConfig(const std::string& text) { std::ofstream(dir_ / "ftctl.json") << text; }
  std::filesystem::path dir_, old_cwd_;
  std::string old_home_;
};

// A listening unix socket at `path`, closed with the returned descriptor.
int Listen(const fs::path& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << path;
  EXPECT_EQ(::listen(fd, 1), 0);
  return fd;
}

TEST_F(ResolveTest, ScriptsRunShSocketIsFoundFromTheProjectAndItsStartHintRestartsIt) {
  const fs::path proj = dir_ / "proj";
  fs::create_directories(proj / "scripts");
  fs::create_directories(proj / "runs");
  fs::create_directories(proj / "sub" / "deeper");
  std::ofstream(proj / "scripts" / "run.sh") << "#!/bin/sh\n";
  // Stopped: nothing found, and the hint says how to start run.sh's daemon again.
  fs::current_path(proj / "sub" / "deeper");
  auto o = ResolveOptions({});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->address, "127.0.0.1:7070");
  EXPECT_NE(o->start_hint.find((proj / "scripts" / "run.sh").string() + " --daemon-only"), std::string::npos)
      << o->start_hint;
  EXPECT_NE(o->start_hint.find((proj / "runs" / "ftd-data").string()), std::string::npos) << o->start_hint;
  // Running: ftctl takes its socket, from the project directory and below it.
  const int fd = Listen(proj / "runs" / "ftd.sock");
  o = ResolveOptions({});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->address, "unix:" + (proj / "runs" / "ftd.sock").string());
  EXPECT_NE(o->address_source.find("scripts/run.sh"), std::string::npos) << o->address_source;
  // An address given wins over what was found.
  setenv("FTD_ADDR", "box", 1);
  EXPECT_EQ(ResolveOptions({})->address, "box:7070");
  unsetenv("FTD_ADDR");
  ::close(fd);
}

TEST_F(ResolveTest, FtdsDefaultDataDirectorySocketIsFound) {
  const fs::path data = dir_ / ".local" / "state" / "ftd";
  fs::create_directories(data);
  const int fd = Listen(data / "ftd.sock");
  auto o = ResolveOptions({});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->address, "unix:" + (data / "ftd.sock").string());
  ::close(fd);
  // Over TCP, what to say to an UNAUTHENTICATED call: that socket.
  o = ResolveOptions(Flags("127.0.0.1:1", 0, ""));
  ASSERT_TRUE(o.ok());
  EXPECT_NE(o->local_hint.find("unix:" + (data / "ftd.sock").string()), std::string::npos) << o->local_hint;
}

TEST_F(ResolveTest, PrecedenceIsFlagThenEnvironmentThenConfigThenDefault) {
  auto o = ResolveOptions({});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->address, "127.0.0.1:7070");
  EXPECT_EQ(o->address_source, "the default");
  EXPECT_EQ(o->timeout.count(), 30000);

  WriteConfig(R"({"addr": "box-a", "timeout_s": 5})");
  o = ResolveOptions({});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->address, "box-a:7070");
  EXPECT_NE(o->address_source.find("ftctl.json"), std::string::npos);
  EXPECT_EQ(o->timeout.count(), 5000);

  setenv("FTD_ADDR", "[::1]", 1);
  o = ResolveOptions({});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->address, "[::1]:7070");
  EXPECT_EQ(o->address_source, "from $FTD_ADDR");

  o = ResolveOptions(Flags("localhost", 1.5, ""));
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->address, "localhost:7070");
  EXPECT_EQ(o->address_source, "from --addr");
  EXPECT_EQ(o->timeout.count(), 1500);
}

TEST_F(ResolveTest, BadConfigOrAddressNamesTheSource) {
  WriteConfig(R"({"adr": "x"})");
  auto o = ResolveOptions({});
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("\"adr\""), std::string::npos) << o.status().message();
  WriteConfig("{}");
  setenv("FTD_ADDR", "box:port", 1);
  o = ResolveOptions({});
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("$FTD_ADDR"), std::string::npos) << o.status().message();
}

TEST_F(ResolveTest, ContextsGiveAddressTlsAndTokenAndAreChosenByFlagThenEnvironmentThenFile) {
  std::ofstream(dir_ / "token") << "ftd_0123456789ab_secret\n";
  WriteConfig(R"({"current_context": "a", "contexts": {
      "a": {"addr": "box-a"},
      "b": {"addr": "box-b:7443", "ca_file": "ca.pem", "token_file": "token"}}})");
  auto o = ResolveOptions({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->address, "box-a:7070");
  EXPECT_FALSE(o->tls);
  EXPECT_EQ(o->token, "");
  setenv("FTD_CONTEXT", "b", 1);
  o = ResolveOptions({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->address, "box-b:7443");
  EXPECT_TRUE(o->tls);
  EXPECT_EQ(o->ca_file, (dir_ / "ca.pem").string());  // relative to the config file
  EXPECT_EQ(o->token, "ftd_0123456789ab_secret");
  o = ResolveOptions(Flags("", 0, "a"));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->address, "box-a:7070");
  o = ResolveOptions(Flags("", 0, "c"));
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("context \"c\""), std::string::npos) << o.status().message();
  EXPECT_NE(o.status().message().find("a, b"), std::string::npos) << o.status().message();
}

TEST_F(ResolveTest, ATokenFileOthersMayReadIsWarnedAboutWithoutItsSecret) {
  const fs::path token = dir_ / "token";
  std::ofstream(token) << "ftd_0123456789ab_secret\n";
  setenv("FTD_TOKEN_FILE", token.c_str(), 1);
  for (const auto& [mode, warned] : {std::pair{0600, false}, {0400, false}, {0640, true}, {0644, true}, {0604, true}}) {
    fs::permissions(token, static_cast<fs::perms>(mode));
    ::testing::internal::CaptureStderr();
    auto o = ResolveOptions({});
    const std::string err = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->token, "ftd_0123456789ab_secret");
    if (!warned) {
      EXPECT_EQ(err, "") << std::oct << mode;
      continue;
    }
    EXPECT_NE(err.find(absl::StrCat("the token file ", token.string(), " ($FTD_TOKEN_FILE)")), std::string::npos) << err;
    EXPECT_NE(err.find(absl::StrCat("chmod 600 ", token.string())), std::string::npos) << err;
    EXPECT_EQ(err.find("secret"), std::string::npos) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
}

TEST_F(ResolveTest, AMissingConfigNamedExplicitlyOrAnUnreadableTokenIsAnError) {
  setenv("FTCTL_CONFIG", (dir_ / "missing.json").c_str(), 1);
  auto o = ResolveOptions({});
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("does not exist"), std::string::npos) << o.status().message();
  setenv("FTCTL_CONFIG", (dir_ / "ftctl.json").c_str(), 1);
  setenv("FTD_TOKEN_FILE", (dir_ / "no-token").c_str(), 1);
  o = ResolveOptions({});
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("no-token"), std::string::npos) << o.status().message();
}

}  // namespace
}  // namespace ftd::client

#include "server/auth/connection_limits.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "server/testing/fake_clock.h"

namespace ftd::server {
namespace {

// A connected socket (one end of a pair; the other end is closed at once), standing for one accepted connection.
int Socket() {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ::close(sv[1]);
  return sv[0];
}

class ConnectionLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSinkForTest([this](const std::string& line) { log.push_back(line); });
  }
  void TearDown() override {
    SetLogSinkForTest(nullptr);
    for (int fd : fds) ::close(fd);
  }
  int Open() {
    fds.push_back(Socket());
    return fds.back();
  }
  void Close(int fd) {
    ::close(fd);
    std::erase(fds, fd);
  }
  testing::FakeClock clock;
  std::vector<int> fds;
  std::vector<std::string> log;
};

TEST_F(ConnectionLimitsTest, APeerIsHeldToItsLimitAndOthersStillGetIn) {
  ConnectionLimits l({100, 3}, &clock);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(l.Admit(Open(), "local user bob (uid 1002)", true).ok());
  const int fourth = Open();
  auto st = l.Admit(fourth, "local user bob (uid 1002)", true);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message(), "local user bob (uid 1002) has 3 connections open, the limit per peer "
                          "(--max-connections-per-peer 3)");
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0], "ftd: refused a connection from local user bob (uid 1002): " + std::string(st.message()) + "\n");
  EXPECT_TRUE(l.Admit(Open(), "local user alice (uid 1001)", true).ok());
  EXPECT_TRUE(l.Admit(Open(), "local user root (uid 0)", true, /*exempt=*/true).ok()) << "local admins";
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(l.Admit(Open(), "local user root (uid 0)", true, true).ok());
  EXPECT_EQ(l.open(), 15);
}

TEST_F(ConnectionLimitsTest, APeerGetsAtMostAnEighthOfTheTotal) {
  ConnectionLimits l({80, 64}, &clock);
  EXPECT_EQ(l.per_peer_limit(), 10);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(l.Admit(Open(), "ipv4:10.0.0.7", false).ok());
  EXPECT_EQ(l.Admit(Open(), "ipv4:10.0.0.7", false).message(),
            "ipv4:10.0.0.7 has 10 connections open, the limit per peer (10: an eighth of --max-connections 80)");
}

TEST_F(ConnectionLimitsTest, AClosedConnectionGivesItsPlaceBack) {
  ConnectionLimits l({100, 2}, &clock);
  const int a = Open();
  ASSERT_TRUE(l.Admit(a, "ipv4:10.0.0.9", false).ok());
  ASSERT_TRUE(l.Admit(Open(), "ipv4:10.0.0.9", false).ok());
  EXPECT_FALSE(l.Admit(Open(), "ipv4:10.0.0.9", false).ok());
  Close(a);  // gRPC closed it
  EXPECT_TRUE(l.Admit(Open(), "ipv4:10.0.0.9", false).ok());
  EXPECT_EQ(l.open(), 2);
}

TEST_F(ConnectionLimitsTest, TheTotalHoldsAndTcpPeersLeaveAQuarterToLocalUsers) {
  ConnectionLimits l({8, 0}, &clock);
  EXPECT_EQ(l.tcp_limit(), 6);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(l.Admit(Open(), "ipv4:10.0.0." + std::to_string(i), false).ok());
  auto st = l.Admit(Open(), "ipv4:10.0.0.99", false);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message(), "TCP peers hold 6 connections, three quarters of --max-connections 8 (the rest is kept for "
                          "local users)");
  ASSERT_TRUE(l.Admit(Open(), "local user alice (uid 1001)", true).ok());
  ASSERT_TRUE(l.Admit(Open(), "local user alice (uid 1001)", true).ok());
  st = l.Admit(Open(), "local user root (uid 0)", true, true);
  EXPECT_EQ(st.message(), "ftd has 8 connections open, its limit (--max-connections 8)");
}

TEST_F(ConnectionLimitsTest, RefusalsAreLoggedAFewAMinutePerPeer) {
  ConnectionLimits l({100, 1}, &clock);
  ASSERT_TRUE(l.Admit(Open(), "ipv4:10.0.0.1", false).ok());
  ASSERT_TRUE(l.Admit(Open(), "ipv4:10.0.0.2", false).ok());
  const auto refuse = [&](const std::string& peer) {
    const int fd = Socket();
    EXPECT_FALSE(l.Admit(fd, peer, false).ok());
    ::close(fd);
  };
  for (int i = 0; i < 500; ++i) refuse("ipv4:10.0.0.1");
  EXPECT_EQ(log.size(), 3u);
  refuse("ipv4:10.0.0.2");  // another peer's refusals are told too
  ASSERT_EQ(log.size(), 4u);
  EXPECT_TRUE(log[3].starts_with("ftd: refused a connection from ipv4:10.0.0.2: ")) << log[3];
  clock.Advance(60'000);
  refuse("ipv4:10.0.0.1");
  ASSERT_EQ(log.size(), 6u);
  EXPECT_EQ(log[4], "ftd: 497 more lines about refused connections left out in the last minute\n");
}

TEST(ConnectionBudget, FitsBelowTheDescriptorLimitWithRoomForTheDaemon) {
  // 40 open, 2 slots: 40 + 8 * 2 + 64 = 120 kept.
  EXPECT_EQ(ReservedDescriptors(40, 2), 120);
  EXPECT_EQ(*ConnectionBudget(0, 1024, 40, 2), 904);
  EXPECT_EQ(*ConnectionBudget(0, 1 << 20, 40, 2), 4096) << "auto is at most 4096";
  EXPECT_EQ(*ConnectionBudget(500, 1024, 40, 2), 500);
  auto st = ConnectionBudget(1000, 1024, 40, 2);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.status().message(),
            "--max-connections 1000 does not fit the descriptor limit (RLIMIT_NOFILE 1024) less the 120 ftd keeps for "
            "itself and its 2 slot(s) (904): lower it, or raise the limit (ulimit -n, or LimitNOFILE= in the "
            "systemd unit)");
  st = ConnectionBudget(0, 128, 40, 2);
  EXPECT_EQ(st.status().message(),
            "the descriptor limit (RLIMIT_NOFILE 128) less the 120 ftd keeps for itself and its 2 slot(s) leaves room "
            "for 8 client connections, fewer than 16: raise the limit (ulimit -n, or LimitNOFILE= in the systemd "
            "unit)");
}

}  // namespace
}  // namespace ftd::server

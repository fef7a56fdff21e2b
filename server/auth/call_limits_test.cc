#include "server/auth/call_limits.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/testing/fake_clock.h"

namespace ftd::server {
namespace {

using testing::FakeClock;

CallLimitsConfig Small() {
  CallLimitsConfig c;
  c.user_rate = 2;
  c.user_burst = 4;
  c.connection_rate = 10;
  c.connection_burst = 10;
  c.user_streams = 3;
  c.connection_streams = 2;
  return c;
}

TEST(CallLimiter, UserRateIsATokenBucket) {
  FakeClock clock;
  CallLimiter l(Small(), &clock);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(l.Admit("bob", "c1", false).ok()) << i;  // the burst
  auto over = l.Admit("bob", "c2", false);  // another connection: the same user's bucket
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.status().message(),
            "user bob is over the call rate limit of 2 calls per second (bursts of 4; --max-calls-per-s-per-user); "
            "retry after a short pause");
  EXPECT_TRUE(l.Admit("alice", "c3", false).ok()) << "another user is not held back";
  clock.Advance(499);
  EXPECT_FALSE(l.Admit("bob", "c1", false).ok()) << "one token takes 500 ms at 2/s";
  clock.Advance(1);
  EXPECT_TRUE(l.Admit("bob", "c1", false).ok());
  EXPECT_FALSE(l.Admit("bob", "c1", false).ok());
  clock.Advance(60'000);  // refills to the burst, no further
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(l.Admit("bob", "c1", false).ok()) << i;
  EXPECT_FALSE(l.Admit("bob", "c1", false).ok());
}

TEST(CallLimiter, ConnectionRateAndARefusedCallCostsNothing) {
  FakeClock clock;
  CallLimitsConfig cfg = Small();
  cfg.user_rate = 0;  // off
  cfg.connection_rate = 1;
  cfg.connection_burst = 2;
  CallLimiter l(cfg, &clock);
  EXPECT_TRUE(l.Admit("bob", "c1", false).ok());
  EXPECT_TRUE(l.Admit("bob", "c1", false).ok());
  auto over = l.Admit("bob", "c1", false);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("--max-calls-per-s-per-connection"), std::string::npos);
  EXPECT_TRUE(l.Admit("bob", "c2", false).ok()) << "another connection has its own bucket";
  // Refusals draw nothing: after 1 s exactly one call passes however many were refused before.
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(l.Admit("bob", "c1", false).ok());
  clock.Advance(1000);
  EXPECT_TRUE(l.Admit("bob", "c1", false).ok());
  EXPECT_FALSE(l.Admit("bob", "c1", false).ok());
}

TEST(CallLimiter, StreamsPerConnectionAndPerUserAreHeldUntilTheLeaseEnds) {
  FakeClock clock;
  CallLimitsConfig cfg = Small();
  cfg.user_rate = cfg.connection_rate = 0;
  CallLimiter l(cfg, &clock);
  std::vector<CallLimiter::Lease> open;
  for (int i = 0; i < 2; ++i) {
    auto s = l.Admit("bob", "c1", true);
    ASSERT_TRUE(s.ok());
    open.push_back(std::move(*s));
  }
  auto over = l.Admit("bob", "c1", true);
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.status().message(), "this connection has 2 streaming calls open, the most one connection may "
                                     "(--max-streams-per-connection 2); close one first");
  EXPECT_TRUE(l.Admit("bob", "c1", false).ok()) << "unary calls are not streams";
  auto third = l.Admit("bob", "c2", true);
  ASSERT_TRUE(third.ok());
  over = l.Admit("bob", "c3", true);
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("user bob has 3 streaming calls open"), std::string::npos);
  EXPECT_NE(over.status().message().find("--max-streams-per-user 3"), std::string::npos);
  open.pop_back();  // a stream ends
  EXPECT_TRUE(l.Admit("bob", "c3", true).ok());  // its lease ends at once too
  EXPECT_TRUE(l.Admit("alice", "c4", true).ok());
}

// Admins have no rate limit, but a stream limit of their own: 10,000 watch streams of one admin
// were 10,000 daemon threads.
TEST(CallLimiter, AnAdminHasNoRateButAStreamLimit) {
  FakeClock clock;
  CallLimitsConfig cfg = Small();
  cfg.admin_streams = 5;
  CallLimiter l(cfg, &clock);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(l.Admit("root", "c1", false, true).ok()) << i;
  std::vector<CallLimiter::Lease> open;
  for (int i = 0; i < 5; ++i) {
    auto s = l.Admit("root", "c1", true, true);  // beyond the user and connection stream limits
    ASSERT_TRUE(s.ok()) << i << ": " << s.status();
    open.push_back(std::move(*s));
  }
  auto over = l.Admit("root", "c2", true, true);
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.status().message(),
            "admin root has 5 streaming calls open (watch, logs, trace), the most an admin may "
            "(--max-streams-per-admin 5); close some first");
  open.pop_back();
  EXPECT_TRUE(l.Admit("root", "c2", true, true).ok());
}

// What thousands of stream threads allocated stays in glibc's arenas after they end unless it is
// trimmed: once the streams fall to a quarter of a large peak, and once none is left.
TEST(CallLimiter, FreeMemoryIsGivenBackWhenTheStreamsHaveFallenFromAPeak) {
  FakeClock clock;
  CallLimitsConfig cfg;
  cfg.admin_streams = 0;
  int trims = 0;
  CallLimiter l(cfg, &clock, [&] { ++trims; });
  std::vector<CallLimiter::Lease> open;
  for (int i = 0; i < 1000; ++i) open.push_back(*l.Admit("root", absl::StrCat("c", i % 8), true, true));
  while (open.size() > 251) open.pop_back();
  EXPECT_EQ(trims, 0);
  open.pop_back();  // 250 open: a quarter of 1000
  EXPECT_EQ(trims, 1);
  while (open.size() > 1) open.pop_back();
  EXPECT_EQ(trims, 1) << "250 is no peak worth trimming at a quarter of";
  open.pop_back();
  EXPECT_EQ(trims, 2) << "none left after a peak of 250";
  for (int i = 0; i < 63; ++i) open.push_back(*l.Admit("root", "c", true, true));
  open.clear();
  EXPECT_EQ(trims, 2) << "a peak of 63 is not worth one";
  for (int i = 0; i < 64; ++i) open.push_back(*l.Admit("root", "c", true, true));
  open.clear();
  EXPECT_EQ(trims, 3) << "none left after a peak of 64";
}

TEST(CallLimiter, IdleConnectionsAreForgotten) {
  FakeClock clock;
  CallLimitsConfig cfg = Small();
  cfg.user_rate = 0;
  CallLimiter l(cfg, &clock);
  std::optional<CallLimiter::Lease> held;
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(l.Admit(absl::StrCat("u", i % 2), absl::StrCat("c", i), false).ok());
  held.emplace(std::move(*l.Admit("bob", "kept", true)));
  EXPECT_EQ(l.tracked(), 3u + 101u);
  clock.Advance(10'000);
  ASSERT_TRUE(l.Admit("carol", "new", false).ok());
  EXPECT_EQ(l.tracked(), 4u) << "bob and his open stream's connection, and carol's new call";
}

}  // namespace
}  // namespace ftd::server

#include "server/policy/usage_ledger.h"

#include <gtest/gtest.h>

namespace ftd::server {
namespace {

constexpr int64_t kHour = 3600'000;

TEST(UsageLedger, WindowCountsTheOverlapOfEndedAndRunningAttempts) {
  UsageLedger u;
  const int64_t t0 = 1'000 * kHour;
  u.Add("bob", {1.0, t0, t0 + 2 * kHour});          // 2 GPU-hours
  u.Add("bob", {0.5, t0 + 3 * kHour, t0 + 5 * kHour});  // 1 GPU-hour (half a GPU)
  u.Add("alice", {1.0, t0, t0 + kHour});
  EXPECT_DOUBLE_EQ(u.GpuHours("bob", t0, t0 + 10 * kHour), 3.0);
  // A window starting an hour in cuts the first attempt to 1 hour.
  EXPECT_DOUBLE_EQ(u.GpuHours("bob", t0 + kHour, t0 + 10 * kHour), 2.0);
  EXPECT_DOUBLE_EQ(u.GpuHours("carol", t0, t0 + 10 * kHour), 0.0);
  // A running attempt counts up to now, and once closed, up to its end.
  u.Open("j-000009", "carol", 1.0, t0);
  EXPECT_DOUBLE_EQ(u.GpuHours("carol", t0, t0 + 4 * kHour), 4.0);
  const UsageInterval closed = u.Close("j-000009", t0 + 2 * kHour);
  EXPECT_EQ(closed.end_ms, t0 + 2 * kHour);
  EXPECT_DOUBLE_EQ(u.GpuHours("carol", t0, t0 + 4 * kHour), 2.0);
  EXPECT_EQ(u.Close("j-000009", t0).gpus, 0.0);  // closed once
  u.ForgetBefore(t0 + 3 * kHour);
  EXPECT_DOUBLE_EQ(u.GpuHours("bob", t0, t0 + 10 * kHour), 1.0);
}

TEST(UsageLedger, DecayedUsageHalvesPerHalfLife) {
  UsageLedger u;
  const int64_t t0 = 1'000 * kHour;
  u.Add("bob", {1.0, t0, t0 + 60'000});  // one GPU-minute
  const double fresh = u.Decayed("bob", t0 + 60'000, 24 * kHour);
  EXPECT_NEAR(fresh, 1.0 / 60, 1e-5);
  EXPECT_NEAR(u.Decayed("bob", t0 + 60'000 + 24 * kHour, 24 * kHour), fresh / 2, 1e-6);
  EXPECT_NEAR(u.Decayed("bob", t0 + 60'000 + 48 * kHour, 24 * kHour), fresh / 4, 1e-6);
  // Older use weighs less than the same use now.
  u.Add("alice", {1.0, t0 + 48 * kHour, t0 + 48 * kHour + 60'000});
  EXPECT_GT(u.Decayed("alice", t0 + 48 * kHour + 60'000, 24 * kHour),
            u.Decayed("bob", t0 + 48 * kHour + 60'000, 24 * kHour));
}

}  // namespace
}  // namespace ftd::server

#include "server/policy/quotas.h"

#include <gtest/gtest.h>

namespace ftd::server {
namespace {

TEST(Quotas, ParsesLimitsAndNamesWhatIsWrong) {
  auto l = ParseUserLimits("queued=5,running=2,gpu-hours=10.5");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->max_queued, 5);
  EXPECT_EQ(l->max_running, 2);
  EXPECT_DOUBLE_EQ(l->gpu_hours, 10.5);
  EXPECT_EQ(l->ToString(), "queued=5,running=2,gpu-hours=10.5");
  EXPECT_FALSE(ParseUserLimits("none")->any());
  auto u = ParseUserLimit("alice:running=4");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->first, "alice");
  EXPECT_EQ(u->second.max_running, 4);
  for (const char* bad : {"queued=0", "running=x", "gpu-hours=-1", "gpus=2", "queued=1,queued=2", ""}) {
    EXPECT_FALSE(ParseUserLimits(bad).ok()) << bad;
  }
  EXPECT_NE(ParseUserLimits("gpus=2").status().message().find("unknown limit \"gpus\""), std::string::npos);
  EXPECT_FALSE(ParseUserLimit("running=4").ok());
  EXPECT_NE(ParseUserLimit("bob:queued=0").status().message().find("user bob"), std::string::npos);
  QuotaConfig q;
  q.defaults.max_queued = 3;
  q.users["alice"] = *ParseUserLimits("queued=9");
  EXPECT_EQ(q.For("alice").max_queued, 9);
  EXPECT_EQ(q.For("bob").max_queued, 3);
  EXPECT_EQ(HoursText(24 * 3600'000LL), "24 h");
  EXPECT_EQ(HoursText(7 * 24 * 3600'000LL), "7 d");
}

}  // namespace
}  // namespace ftd::server

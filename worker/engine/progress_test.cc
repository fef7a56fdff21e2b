#include "worker/engine/progress.h"

#include <chrono>
#include <vector>

#include "gtest/gtest.h"

namespace ftd::engine {
namespace {

TEST(ProgressMeterTest, ReportsStartThrottledProgressAndEnd) {
  std::vector<Progress> seen;
  ProgressFn fn = [&](const Progress& p) { seen.push_back(p); };
  {
    ProgressMeter m(fn, ProgressPhase::kSaveCheckpoint, 1000, std::chrono::hours(1));
    for (int i = 0; i < 10; ++i) m.Add(50);
    m.Finish();
    m.Finish();
  }
  ASSERT_EQ(seen.size(), 2u);  // the start and the end; everything between was within the interval
  EXPECT_EQ(seen[0].phase, ProgressPhase::kSaveCheckpoint);
  EXPECT_EQ(seen[0].done_bytes, 0u);
  EXPECT_EQ(seen[0].total_bytes, 1000u);
  EXPECT_EQ(seen[1].done_bytes, 1000u);
  EXPECT_EQ(seen[1].total_bytes, 1000u);
}

TEST(ProgressMeterTest, EveryAddIsReportedOnceTheIntervalHasPassed) {
  std::vector<Progress> seen;
  ProgressMeter m([&](const Progress& p) { seen.push_back(p); }, ProgressPhase::kLoadCheckpoint, 0,
                  std::chrono::nanoseconds(0));
  m.AddTotal(30);
  m.Add(10);
  m.AddTotal(30);
  m.Add(20);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[1].done_bytes, 10u);
  EXPECT_EQ(seen[1].total_bytes, 30u);
  EXPECT_EQ(seen[2].done_bytes, 30u);
  EXPECT_EQ(seen[2].total_bytes, 60u);
}

TEST(ProgressMeterTest, NoCallbackIsANoOp) {
  ProgressMeter m(ProgressFn(), ProgressPhase::kLoadData, 10);
  m.Add(10);
  m.Finish();
  EXPECT_STREQ(ProgressPhaseName(ProgressPhase::kLoadData), "load_data");
}

}  // namespace
}  // namespace ftd::engine

#include "worker/engine/core/progress.h"

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

TEST(WriteEtaTest, PredictsFromThePreviousWriteThenFromThisOnesOwnRate) {
  using std::chrono::milliseconds;
  const auto t0 = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
  WriteEta eta(std::chrono::seconds(1));
  auto at = [&](uint64_t done, uint64_t total, int ms) {
    Progress p;
    p.phase = ProgressPhase::kSaveCheckpoint;
    p.done_bytes = done;
    p.total_bytes = total;
    return eta.Observe(p, t0 + milliseconds(ms));
  };
  // The first write: nothing measured before it, and its own rate only after the settling second.
  EXPECT_LT(at(0, 1000, 0), 0);
  EXPECT_LT(at(900, 1000, 500), 0) << "the page cache's rate in the first moments is not the disk's";
  EXPECT_DOUBLE_EQ(at(400, 1000, 2000), 3.0);  // 200 B/s so far: 600 bytes left take 3 s
  EXPECT_EQ(at(1000, 1000, 4000), 0.0);
  EXPECT_DOUBLE_EQ(eta.bytes_per_s(), 250.0);  // 1000 bytes in 4 s
  // The next write is predicted from the start with the measured rate: 2000 bytes at 250 B/s.
  EXPECT_DOUBLE_EQ(at(0, 2000, 10000), 8.0);
  EXPECT_DOUBLE_EQ(at(500, 2000, 10500), 6.0);  // still settling: the previous rate
  EXPECT_DOUBLE_EQ(at(1000, 2000, 12000), 2.0);  // then this one's: 500 B/s
  EXPECT_EQ(at(2000, 2000, 14000), 0.0);
  EXPECT_DOUBLE_EQ(eta.bytes_per_s(), 500.0);
}

}  // namespace
}  // namespace ftd::engine

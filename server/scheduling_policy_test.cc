#include "server/scheduling_policy.h"

#include <gtest/gtest.h>

#include "absl/strings/str_format.h"

namespace ftd::server {
namespace {

void Add(JobQueue* q, int64_t seq, int priority, int64_t not_before = 0) {
  ftd::v1::Job j;
  j.set_id(absl::StrFormat("j-%06d", seq));
  j.set_priority(priority);
  j.set_not_before_unix_ms(not_before);
  ASSERT_TRUE(q->Put(j));
}

std::vector<std::pair<std::string, std::string>> Starts(const SchedulingPlan& p) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& s : p.starts) out.emplace_back(s.job_id, s.slot);
  return out;
}

TEST(Schedule, HighestPriorityThenOldestGetsTheFirstFreeSlot) {
  JobQueue q;
  Add(&q, 1, 0);
  Add(&q, 2, 5);
  Add(&q, 3, 5);
  const auto plan = Schedule({&q, {"gpu:1"}, 1000});
  EXPECT_EQ(Starts(plan), (std::vector<std::pair<std::string, std::string>>{{"j-000002", "gpu:1"}}));
  EXPECT_FALSE(plan.recheck_at_ms.has_value());
}

TEST(Schedule, FillsEveryFreeSlotInOrder) {
  JobQueue q;
  Add(&q, 1, 0);
  Add(&q, 2, 1);
  const auto plan = Schedule({&q, {"gpu:0", "gpu:2", "gpu:3"}, 1000});
  EXPECT_EQ(Starts(plan),
            (std::vector<std::pair<std::string, std::string>>{{"j-000002", "gpu:0"}, {"j-000001", "gpu:2"}}));
}

TEST(Schedule, NothingWithoutAFreeSlot) {
  JobQueue q;
  Add(&q, 1, 0, 5000);
  const auto plan = Schedule({&q, {}, 1000});
  EXPECT_TRUE(plan.starts.empty());
  EXPECT_FALSE(plan.recheck_at_ms.has_value());  // an exit frees a slot and wakes the scheduler
}

TEST(Schedule, AJobInBackoffWaitsWithoutHoldingUpTheOthers) {
  JobQueue q;
  Add(&q, 1, 9, 5000);  // retrying: not before 5000
  Add(&q, 2, 9, 3000);
  Add(&q, 3, 0);
  auto plan = Schedule({&q, {"cpu"}, 1000});
  EXPECT_EQ(Starts(plan), (std::vector<std::pair<std::string, std::string>>{{"j-000003", "cpu"}}));
  EXPECT_EQ(plan.recheck_at_ms, 3000);
  plan = Schedule({&q, {"cpu"}, 5000});  // both deadlines passed: the older one first
  EXPECT_EQ(Starts(plan), (std::vector<std::pair<std::string, std::string>>{{"j-000001", "cpu"}}));
}

TEST(Schedule, EmptyQueue) {
  JobQueue q;
  const auto plan = Schedule({&q, {"cpu"}, 0});
  EXPECT_TRUE(plan.starts.empty());
  EXPECT_FALSE(plan.recheck_at_ms.has_value());
}

}  // namespace
}  // namespace ftd::server

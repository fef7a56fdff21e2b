#include "server/policy/scheduling_policy.h"

#include <gtest/gtest.h>

#include "absl/strings/str_format.h"

namespace ftd::server {
namespace {

void Add(JobQueue* q, int64_t seq, int priority, int64_t not_before = 0, const std::string& owner = "",
         int64_t gib = 0) {
  ftd::v1::Job j;
  j.set_id(absl::StrFormat("j-%06d", seq));
  j.set_priority(priority);
  j.set_not_before_unix_ms(not_before);
  j.set_owner(owner);
  j.set_predicted_peak_bytes(gib << 30);
  ASSERT_TRUE(q->Put(j));
}

// Rooms of one free slot each (one job per GPU), as the slot names say ("cpu": the CPU).
std::vector<GpuRoom> Slots(const std::vector<std::string>& names) {
  std::vector<GpuRoom> rooms;
  for (const auto& n : names) {
    GpuRoom r;
    r.gpu = n == "cpu" ? -1 : std::stoi(n.substr(4));
    r.free_slots = {n};
    rooms.push_back(r);
  }
  return rooms;
}

SchedulingInput In(const JobQueue* q, const std::vector<std::string>& slots, int64_t now) {
  return {q, Slots(slots), now, 0, nullptr};
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
  const auto plan = Schedule(In(&q, {"gpu:1"}, 1000));
  EXPECT_EQ(Starts(plan), (std::vector<std::pair<std::string, std::string>>{{"j-000002", "gpu:1"}}));
  EXPECT_FALSE(plan.recheck_at_ms.has_value());
}

TEST(Schedule, FillsEveryFreeSlotInOrder) {
  JobQueue q;
  Add(&q, 1, 0);
  Add(&q, 2, 1);
  const auto plan = Schedule(In(&q, {"gpu:0", "gpu:2", "gpu:3"}, 1000));
  EXPECT_EQ(Starts(plan),
            (std::vector<std::pair<std::string, std::string>>{{"j-000002", "gpu:0"}, {"j-000001", "gpu:2"}}));
}

TEST(Schedule, NothingWithoutAFreeSlot) {
  JobQueue q;
  Add(&q, 1, 0, 5000);
  const auto plan = Schedule(In(&q, {}, 1000));
  EXPECT_TRUE(plan.starts.empty());
  EXPECT_FALSE(plan.recheck_at_ms.has_value());  // an exit frees a slot and wakes the scheduler
}

TEST(Schedule, AJobInBackoffWaitsWithoutHoldingUpTheOthers) {
  JobQueue q;
  Add(&q, 1, 9, 5000);  // retrying: not before 5000
  Add(&q, 2, 9, 3000);
  Add(&q, 3, 0);
  auto plan = Schedule(In(&q, {"cpu"}, 1000));
  EXPECT_EQ(Starts(plan), (std::vector<std::pair<std::string, std::string>>{{"j-000003", "cpu"}}));
  EXPECT_EQ(plan.recheck_at_ms, 3000);
  plan = Schedule(In(&q, {"cpu"}, 5000));  // both deadlines passed: the older one first
  EXPECT_EQ(Starts(plan), (std::vector<std::pair<std::string, std::string>>{{"j-000001", "cpu"}}));
}

TEST(Schedule, AJobOnSeveralGpusGetsThemAllOrWaitsHoldingItsPlace) {
  JobQueue q;
  ftd::v1::Job big;
  big.set_id("j-000001");
  big.mutable_spec()->set_gpus(2);
  ASSERT_TRUE(q.Put(big));
  Add(&q, 2, 0);
  // One GPU free: the 2-GPU job waits, and the job behind it does not take the GPU it waits for.
  const auto one = Schedule(In(&q, {"gpu:1"}, 1000));
  EXPECT_TRUE(one.starts.empty());
  EXPECT_EQ(one.waits_for_gpus, "j-000001");
  EXPECT_TRUE(one.waits_for_memory.empty());
  // A GPU with a job on it and a free slot is not a whole free GPU: still waiting.
  auto rooms = Slots({"gpu:0"});
  GpuRoom shared;
  shared.gpu = 1;
  shared.free_slots = {"gpu:1/1"};
  shared.jobs = 1;
  rooms.push_back(shared);
  const auto part = Schedule({&q, rooms, 1000, 0, nullptr});
  EXPECT_TRUE(part.starts.empty());
  EXPECT_EQ(part.waits_for_gpus, "j-000001");
  // Three free: it takes two at once; the next job the third.
  const auto plan = Schedule(In(&q, {"gpu:0", "gpu:2", "gpu:3"}, 1000));
  ASSERT_EQ(plan.starts.size(), 2u);
  EXPECT_TRUE(plan.waits_for_gpus.empty());
  EXPECT_EQ(plan.starts[0].job_id, "j-000001");
  EXPECT_EQ(plan.starts[0].slot, "gpu:0");
  EXPECT_EQ(plan.starts[0].gpu, 0);
  EXPECT_EQ(plan.starts[0].more_slots, std::vector<std::string>{"gpu:2"});
  EXPECT_EQ(plan.starts[0].more_gpus, std::vector<int>{2});
  EXPECT_EQ(plan.starts[1].job_id, "j-000002");
  EXPECT_EQ(plan.starts[1].slot, "gpu:3");
  // Ranks on the CPU share the CPU slot.
  JobQueue cpu;
  big.mutable_spec()->set_device("cpu");
  ASSERT_TRUE(cpu.Put(big));
  EXPECT_EQ(Starts(Schedule(In(&cpu, {"cpu"}, 1000))),
            (std::vector<std::pair<std::string, std::string>>{{"j-000001", "cpu"}}));
}

TEST(Schedule, EmptyQueue) {
  JobQueue q;
  const auto plan = Schedule(In(&q, {"cpu"}, 0));
  EXPECT_TRUE(plan.starts.empty());
  EXPECT_FALSE(plan.recheck_at_ms.has_value());
}

// A GPU of 80 GiB with two slots; `used` GiB predicted on it by `jobs` jobs.
GpuRoom Gpu(int gpu, int free_slots, int jobs, int64_t used_gib) {
  GpuRoom r;
  r.gpu = gpu;
  for (int k = 0; k < free_slots; ++k) r.free_slots.push_back(absl::StrFormat("gpu:%d/%d", gpu, jobs + k));
  r.jobs = jobs;
  r.capacity_bytes = int64_t{80} << 30;
  r.used_bytes = used_gib << 30;
  return r;
}

TEST(Schedule, JobsShareAGpuWhileTheirPredictedPeaksFitLessTheMargin) {
  JobQueue q;
  Add(&q, 1, 0, 0, "a", 30);
  Add(&q, 2, 0, 0, "a", 30);
  Add(&q, 3, 0, 0, "a", 30);
  SchedulingInput in{&q, {Gpu(0, 3, 0, 0)}, 1000, int64_t{4} << 30, nullptr};
  auto plan = Schedule(in);
  // 30 + 30 + 4 (margin) fits 80; a third (94) does not: it waits for memory.
  EXPECT_EQ(Starts(plan), (std::vector<std::pair<std::string, std::string>>{{"j-000001", "gpu:0/0"},
                                                                            {"j-000002", "gpu:0/1"}}));
  EXPECT_EQ(plan.waits_for_memory, "j-000003");
  EXPECT_EQ(plan.starts[0].gpu, 0);
  // With a margin of 21 GiB the second does not fit beside the first (30 + 30 + 21 > 80).
  in.margin_bytes = int64_t{21} << 30;
  plan = Schedule(in);
  EXPECT_EQ(plan.starts.size(), 1u);
  EXPECT_EQ(plan.waits_for_memory, "j-000002");
}

TEST(Schedule, AJobGoesToTheFullestGpuItFitsAndAnUnknownSizeGetsAGpuOfItsOwn) {
  JobQueue q;
  Add(&q, 1, 0, 0, "a", 20);
  Add(&q, 2, 0, 0, "a", 0);  // predicted size unknown
  SchedulingInput in{&q, {Gpu(0, 1, 0, 0), Gpu(1, 1, 1, 40), Gpu(2, 1, 1, 10)}, 1000, 0, nullptr};
  const auto plan = Schedule(in);
  ASSERT_EQ(plan.starts.size(), 2u);
  EXPECT_EQ(plan.starts[0].gpu, 1);  // 40 + 20 of 80: the fullest that fits
  EXPECT_EQ(plan.starts[1].gpu, 0);  // the only empty GPU
  GpuRoom exclusive = Gpu(0, 1, 1, 0);
  exclusive.exclusive = true;
  EXPECT_FALSE(Fits(exclusive, int64_t{1} << 30, 0));
  EXPECT_TRUE(Fits(exclusive, 0, 0));  // a CPU job needs no GPU memory
}

TEST(Schedule, ALargeJobThatFitsNowhereHoldsUpSmallerOnesBehindIt) {
  JobQueue q;
  Add(&q, 1, 0, 0, "a", 60);
  Add(&q, 2, 0, 0, "b", 5);
  SchedulingInput in{&q, {Gpu(0, 1, 1, 40)}, 1000, 0, nullptr};
  const auto plan = Schedule(in);
  EXPECT_TRUE(plan.starts.empty());
  EXPECT_EQ(plan.waits_for_memory, "j-000001");
}

TEST(Schedule, AmongEqualPrioritiesTheOwnerWithLessRecentUsageGoesFirst) {
  JobQueue q;
  Add(&q, 1, 0, 0, "alice");
  Add(&q, 2, 0, 0, "alice");
  Add(&q, 3, 0, 0, "bob");
  Add(&q, 4, 5, 0, "alice");
  std::map<std::string, OwnerState> owners;
  owners["alice"].usage = 3.0;
  owners["bob"].usage = 0.5;
  SchedulingInput in{&q, Slots({"gpu:0", "gpu:1", "gpu:2", "gpu:3"}), 1000, 0, &owners};
  const auto plan = Schedule(in);
  std::vector<std::string> ids;
  for (const auto& p : plan.starts) ids.push_back(p.job_id);
  // Priority first; then bob (less usage) before alice's older jobs; alice's in submission order.
  EXPECT_EQ(ids, (std::vector<std::string>{"j-000004", "j-000003", "j-000001", "j-000002"}));
  const auto spots = QueueSpots(q, &owners);
  EXPECT_EQ(spots.at("j-000001").position, 3);
  EXPECT_EQ(spots.at("j-000001").ahead_higher_priority, 1);
  EXPECT_EQ(spots.at("j-000001").ahead_lower_usage, 1);
  EXPECT_EQ(spots.at("j-000002").ahead_lower_usage, 1);
  EXPECT_EQ(spots.at("j-000003").ahead_lower_usage, 0);
  // Without fair share: submission order within the priority.
  const auto plain = Schedule(In(&q, {"gpu:0", "gpu:1", "gpu:2", "gpu:3"}, 1000));
  EXPECT_EQ(plain.starts[1].job_id, "j-000001");
}

TEST(Schedule, AnOwnerAtALimitIsPassedOverWithoutHoldingUpOthers) {
  JobQueue q;
  Add(&q, 1, 0, 0, "alice");
  Add(&q, 2, 0, 0, "alice");
  Add(&q, 3, 0, 0, "carol");
  Add(&q, 4, 0, 0, "bob");
  std::map<std::string, OwnerState> owners;
  owners["alice"].running = 1;
  owners["alice"].max_running = 2;  // one more may start
  owners["carol"].held = "GPU-hours spent";
  SchedulingInput in{&q, Slots({"gpu:0", "gpu:1", "gpu:2"}), 1000, 0, &owners};
  const auto plan = Schedule(in);
  std::vector<std::string> ids;
  for (const auto& p : plan.starts) ids.push_back(p.job_id);
  EXPECT_EQ(ids, (std::vector<std::string>{"j-000001", "j-000004"}));
}

}  // namespace
}  // namespace ftd::server

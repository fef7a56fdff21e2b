#include "server/policy/job_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "absl/strings/str_format.h"

namespace ftd::server {
namespace {

ftd::v1::Job MakeJob(int64_t seq, int priority, int64_t not_before = 0) {
  ftd::v1::Job j;
  j.set_id(absl::StrFormat("j-%06d", seq));
  j.set_priority(priority);
  j.set_not_before_unix_ms(not_before);
  return j;
}

TEST(SubmissionSeq, ParsesJobIdsOnly) {
  EXPECT_EQ(SubmissionSeq("j-000042"), 42);
  EXPECT_EQ(SubmissionSeq("j-1234567"), 1234567);
  EXPECT_EQ(SubmissionSeq("j-42"), std::nullopt);
  EXPECT_EQ(SubmissionSeq("x-000042"), std::nullopt);
  EXPECT_EQ(SubmissionSeq("j-00004x"), std::nullopt);
  EXPECT_EQ(SubmissionSeq("j-000000"), std::nullopt);
  EXPECT_EQ(SubmissionSeq(""), std::nullopt);
}

TEST(JobQueue, PriorityThenSubmissionOrder) {
  JobQueue q;
  ASSERT_TRUE(q.Put(MakeJob(1, 0)));
  ASSERT_TRUE(q.Put(MakeJob(2, 5)));
  ASSERT_TRUE(q.Put(MakeJob(3, 0)));
  ASSERT_TRUE(q.Put(MakeJob(4, -1)));
  EXPECT_EQ(q.Position("j-000002"), 1);
  EXPECT_EQ(q.Position("j-000001"), 2);
  EXPECT_EQ(q.Position("j-000003"), 3);
  EXPECT_EQ(q.Position("j-000004"), 4);
  EXPECT_EQ(q.Position("j-000009"), 0);
  std::vector<std::string> order;
  q.ForEach([&](const QueuedJob& j) {
    order.push_back(j.id);
    return true;
  });
  EXPECT_EQ(order, (std::vector<std::string>{"j-000002", "j-000001", "j-000003", "j-000004"}));
  EXPECT_TRUE(q.Remove("j-000002"));
  EXPECT_FALSE(q.Remove("j-000002"));
  EXPECT_EQ(q.Position("j-000001"), 1);
  // Put again (a retry) keeps its submission place, with its new deadline.
  ASSERT_TRUE(q.Put(MakeJob(2, 5, 777)));
  EXPECT_EQ(q.Position("j-000002"), 1);
  EXPECT_EQ(q.Find("j-000002")->not_before_ms, 777);
  EXPECT_EQ(q.size(), 4u);
  EXPECT_FALSE(q.Put(ftd::v1::Job()));  // no id
}

// Positions agree with a plain sorted list through random submits, starts and cancels.
TEST(JobQueue, PositionsMatchASortedListUnderRandomChanges) {
  std::mt19937 rng(7);
  JobQueue q;
  std::vector<std::pair<int, int64_t>> ref;  // (-priority, seq)
  int64_t next = 1;
  for (int op = 0; op < 3000; ++op) {
    if (ref.empty() || rng() % 3 != 0) {
      const int prio = static_cast<int>(rng() % 5) - 2;
      ASSERT_TRUE(q.Put(MakeJob(next, prio)));
      ref.emplace_back(-prio, next++);
    } else {
      const size_t i = rng() % ref.size();
      ASSERT_TRUE(q.Remove(absl::StrFormat("j-%06d", ref[i].second)));
      ref.erase(ref.begin() + static_cast<long>(i));
    }
    if (op % 100 == 0) {
      auto sorted = ref;
      std::sort(sorted.begin(), sorted.end());
      for (size_t i = 0; i < sorted.size(); ++i) {
        ASSERT_EQ(q.Position(absl::StrFormat("j-%06d", sorted[i].second)), static_cast<int64_t>(i + 1));
      }
    }
  }
  EXPECT_EQ(q.size(), ref.size());
}

}  // namespace
}  // namespace ftd::server

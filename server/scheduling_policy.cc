#include "server/scheduling_policy.h"

#include <algorithm>

namespace ftd::server {

SchedulingPlan Schedule(const SchedulingInput& in) {
  SchedulingPlan plan;
  size_t next_slot = 0;
  if (in.queue == nullptr || in.free_slots.empty()) return plan;
  in.queue->ForEach([&](const QueuedJob& job) {
    if (job.not_before_ms > in.now_ms) {
      plan.recheck_at_ms = std::min(plan.recheck_at_ms.value_or(job.not_before_ms), job.not_before_ms);
      return true;
    }
    plan.starts.push_back({job.id, in.free_slots[next_slot++]});
    return next_slot < in.free_slots.size();
  });
  return plan;
}

}  // namespace ftd::server

#include "server/policy/scheduling_policy.h"

#include <algorithm>
#include <tuple>

namespace ftd::server {

namespace {

const OwnerState kNobody;

const OwnerState& StateOf(const std::map<std::string, OwnerState>* owners, const std::string& owner) {
  if (owners == nullptr) return kNobody;
  auto it = owners->find(owner);
  return it == owners->end() ? kNobody : it->second;
}

}  // namespace

bool Fits(const GpuRoom& room, int64_t bytes, int64_t margin_bytes) {
  if (room.free_slots.empty()) return false;
  if (room.jobs == 0 || bytes == 0) return true;
  if (bytes < 0 || room.exclusive) return false;
  if (room.capacity_bytes <= 0) return true;
  return room.used_bytes + bytes + margin_bytes <= room.capacity_bytes;
}

std::vector<size_t> WholeFreeGpus(const std::vector<GpuRoom>& rooms) {
  std::vector<size_t> whole;
  for (size_t i = 0; i < rooms.size(); ++i) {
    if (rooms[i].gpu >= 0 && rooms[i].jobs == 0 && !rooms[i].free_slots.empty()) whole.push_back(i);
  }
  return whole;
}

int BestRoom(const std::vector<GpuRoom>& rooms, int64_t bytes, int64_t margin_bytes) {
  int best = -1;
  for (size_t i = 0; i < rooms.size(); ++i) {
    const GpuRoom& r = rooms[i];
    if (!Fits(r, bytes, margin_bytes)) continue;
    if (best < 0 || std::make_pair(r.jobs > 0, r.used_bytes) > std::make_pair(rooms[best].jobs > 0, rooms[best].used_bytes)) {
      best = static_cast<int>(i);
    }
  }
  return best;
}

std::vector<const QueuedJob*> FairOrder(const JobQueue& queue, const std::map<std::string, OwnerState>* owners) {
  std::vector<const QueuedJob*> order;
  order.reserve(queue.size());
  queue.ForEach([&](const QueuedJob& j) {
    order.push_back(&j);
    return true;
  });
  if (owners == nullptr || owners->empty()) return order;  // the queue's own order: priority, then seq
  std::stable_sort(order.begin(), order.end(), [&](const QueuedJob* a, const QueuedJob* b) {
    return std::make_tuple(-a->priority, StateOf(owners, a->owner).usage, a->seq) <
           std::make_tuple(-b->priority, StateOf(owners, b->owner).usage, b->seq);
  });
  return order;
}

std::unordered_map<std::string, QueueSpot> QueueSpots(const JobQueue& queue,
                                                      const std::map<std::string, OwnerState>* owners) {
  std::unordered_map<std::string, QueueSpot> spots;
  const auto order = FairOrder(queue, owners);
  int64_t group_start = 0, usage_start = 0;  // first index of the current priority, and of its usage
  for (size_t i = 0; i < order.size(); ++i) {
    const QueuedJob& j = *order[i];
    if (i > 0 && order[i - 1]->priority != j.priority) {
      group_start = usage_start = static_cast<int64_t>(i);
    } else if (i > 0 && StateOf(owners, order[i - 1]->owner).usage != StateOf(owners, j.owner).usage) {
      usage_start = static_cast<int64_t>(i);
    }
    spots[j.id] = {static_cast<int64_t>(i) + 1, group_start, usage_start - group_start};
  }
  return spots;
}

SchedulingPlan Schedule(const SchedulingInput& in) {
  SchedulingPlan plan;
  if (in.queue == nullptr) return plan;
  std::vector<GpuRoom> rooms = in.rooms;
  auto any_free = [&] {
    return std::any_of(rooms.begin(), rooms.end(), [](const GpuRoom& r) { return !r.free_slots.empty(); });
  };
  std::map<std::string, int> started;  // by owner, in this round
  for (const QueuedJob* job : FairOrder(*in.queue, in.owners)) {
    if (!any_free()) break;
    if (job->not_before_ms > in.now_ms) {
      plan.recheck_at_ms = std::min(plan.recheck_at_ms.value_or(job->not_before_ms), job->not_before_ms);
      continue;
    }
    const OwnerState& owner = StateOf(in.owners, job->owner);
    if (!owner.held.empty()) continue;
    if (owner.max_running > 0 && owner.running + started[job->owner] >= owner.max_running) continue;
    if (job->gpus > 1) {
      // A job on several GPUs takes that many whole free GPUs (no other job on them) all at once,
      // or waits holding its place: no job behind it takes the GPUs it waits for.
      std::vector<size_t> whole = WholeFreeGpus(rooms);
      if (whole.size() < static_cast<size_t>(job->gpus)) {
        plan.waits_for_gpus = job->id;
        break;
      }
      whole.resize(static_cast<size_t>(job->gpus));
      Placement p{job->id, rooms[whole[0]].free_slots.front(), rooms[whole[0]].gpu, {}, {}};
      for (size_t k = 0; k < whole.size(); ++k) {
        GpuRoom& r = rooms[whole[k]];
        if (k > 0) {
          p.more_slots.push_back(r.free_slots.front());
          p.more_gpus.push_back(r.gpu);
        }
        r.free_slots.erase(r.free_slots.begin());
        ++r.jobs;
        r.exclusive = true;
      }
      plan.starts.push_back(std::move(p));
      ++started[job->owner];
      continue;
    }
    const int b = BestRoom(rooms, job->gpu_bytes, in.margin_bytes);
    if (b < 0) {
      plan.waits_for_memory = job->id;
      break;
    }
    GpuRoom* best = &rooms[b];
    plan.starts.push_back({job->id, best->free_slots.front(), best->gpu, {}, {}});
    best->free_slots.erase(best->free_slots.begin());
    ++best->jobs;
    if (job->gpu_bytes < 0) {
      best->exclusive = true;
    } else {
      best->used_bytes += job->gpu_bytes;
    }
    ++started[job->owner];
  }
  return plan;
}

}  // namespace ftd::server

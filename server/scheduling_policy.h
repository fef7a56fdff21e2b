// Which queued jobs start now, and on which slots: a pure function of the queue, the free slots and
// the time. Today's policy: the queue's order (highest priority first, then submission order); a job
// waiting out a retry backoff is passed over until its deadline. A fairer policy (per owner) replaces
// Schedule() and reads what it needs from SchedulingInput.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/job_queue.h"

namespace ftd::server {

struct SchedulingInput {
  const JobQueue* queue = nullptr;
  std::vector<std::string> free_slots;  // in slot order
  int64_t now_ms = 0;                   // unix ms
};

struct Placement {
  std::string job_id;
  std::string slot;
};

struct SchedulingPlan {
  std::vector<Placement> starts;
  // The earliest retry deadline among jobs passed over while a slot was free: when to look again
  // if nothing else happens first.
  std::optional<int64_t> recheck_at_ms;
};

SchedulingPlan Schedule(const SchedulingInput& in);

}  // namespace ftd::server

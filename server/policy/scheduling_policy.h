// Which queued jobs start now, and where: a pure function of the queue, the GPUs' free slots and
// predicted memory, the owners' usage and limits, and the time.
//
// Order: highest priority first; among equal priorities, the owner with the least decayed recent
// GPU usage first (fair share, as Slurm's), then submission order. A job waiting out a retry
// backoff, and the jobs of an owner held by a limit (running jobs, GPU-hours), are passed over
// without holding up the others.
//
// Placement: a GPU takes jobs while it has a free slot and the predicted peaks of the jobs on it
// (spec/peak_memory.h), plus the newcomer's, fit its memory less a safety margin. A job alone on a
// GPU needs only to fit the GPU (submit refuses one that does not). A job of unknown size gets a GPU
// of its own. Among the GPUs it fits, a job goes to the fullest (packing keeps whole GPUs free for
// large jobs). The first job in order that fits nowhere waits, and the jobs behind it wait too, so a
// large job is not overtaken forever by small ones. A job on N GPUs (spec.gpus) takes N GPUs with
// no other job on them all at once, or waits the same way.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "server/policy/job_queue.h"

namespace ftd::server {

// One GPU, or the CPU slot (gpu -1).
struct GpuRoom {
  int gpu = -1;                         // CUDA device index; -1: the CPU
  std::vector<std::string> free_slots;  // in slot order
  int jobs = 0;                         // jobs on it now
  int64_t capacity_bytes = 0;           // its memory; 0: unknown (placed by free slots alone)
  int64_t used_bytes = 0;               // predicted peaks of the jobs on it
  bool exclusive = false;               // a job of unknown size is on it: no GPU job joins
};

// What the policy knows of one owner of queued jobs.
struct OwnerState {
  double usage = 0;      // decayed recent GPU-hours (fair share); 0 when fair share is off
  int running = 0;       // jobs running now
  int max_running = 0;   // 0: no limit
  std::string held;      // not empty: no job of this owner starts, and why (e.g. GPU-hours spent)
};

struct SchedulingInput {
  const JobQueue* queue = nullptr;
  std::vector<GpuRoom> rooms;
  int64_t now_ms = 0;       // unix ms
  int64_t margin_bytes = 0; // kept free on a GPU that holds more than one job
  // By owner; an owner missing here has no usage and no limits.
  const std::map<std::string, OwnerState>* owners = nullptr;
};

struct Placement {
  std::string job_id;
  std::string slot;
  int gpu = -1;
  std::vector<std::string> more_slots;  // a job with gpus > 1: its other GPUs
  std::vector<int> more_gpus;            // their CUDA device indices
};

struct SchedulingPlan {
  std::vector<Placement> starts;
  // The earliest retry deadline among jobs passed over while a slot was free: when to look again
  // if nothing else happens first.
  std::optional<int64_t> recheck_at_ms;
  // The job that fits on no GPU now (its predicted peak) and holds up those behind it; empty: none.
  std::string waits_for_memory;
  // The job on several GPUs that finds too few whole free GPUs and holds up those behind it.
  std::string waits_for_gpus;
};

SchedulingPlan Schedule(const SchedulingInput& in);

// Whether a job of `bytes` predicted GPU memory (0: none, a CPU job; -1: unknown) may join `room`.
bool Fits(const GpuRoom& room, int64_t bytes, int64_t margin_bytes);

// The GPUs with a free slot and no job on them (indices into `rooms`, in order): where a job on
// several GPUs may go.
std::vector<size_t> WholeFreeGpus(const std::vector<GpuRoom>& rooms);

// The room a job of `bytes` goes to: the fullest it fits on (the first of equals); -1: none.
int BestRoom(const std::vector<GpuRoom>& rooms, int64_t bytes, int64_t margin_bytes);

// The queue in the order above (retry deadlines and limits aside).
std::vector<const QueuedJob*> FairOrder(const JobQueue& queue, const std::map<std::string, OwnerState>* owners);

// Where each queued job stands in FairOrder: its 1-based position, and how many of the jobs ahead
// have a higher priority and how many are of owners with lower usage at its priority.
struct QueueSpot {
  int64_t position = 0;
  int64_t ahead_higher_priority = 0;
  int64_t ahead_lower_usage = 0;
};
std::unordered_map<std::string, QueueSpot> QueueSpots(const JobQueue& queue,
                                                      const std::map<std::string, OwnerState>* owners);

}  // namespace ftd::server

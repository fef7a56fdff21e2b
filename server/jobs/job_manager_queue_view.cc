// What the scheduler sees and what clients are told about it: the GPUs' rooms (free slots, predicted
// memory in use) and the owners of queued jobs (usage, running jobs, quota holds) that Tick() hands
// to the scheduling policy; the GPU share gauges; and the annotations of a job read by Get and List
// (queue position, why a queued job waits, the phase of a running one) or of a validate_only submit
// (where it would start). Reads take view_mu_ only.
#include "server/jobs/job_manager.h"

#include <algorithm>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/policy/scheduling_policy.h"
#include "spec/bytes.h"

namespace ftd::server {
namespace fs = std::filesystem;
using ftd::v1::Job;
using ftd::v1::JobEvent;
using ftd::v1::RunResult;

std::vector<GpuRoom> JobManager::RoomsLocked() const {
  std::vector<GpuRoom> rooms;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (rooms.empty() || rooms.back().gpu != slot_gpu_[i]) {
      rooms.push_back({});
      rooms.back().gpu = slot_gpu_[i];
      rooms.back().capacity_bytes = slot_gpu_[i] >= 0 ? cfg_.memory.gpu_bytes : 0;
    }
    GpuRoom& r = rooms.back();
    auto it = slot_use_.find(slots_[i]);
    if (it == slot_use_.end()) {
      r.free_slots.push_back(slots_[i]);
      continue;
    }
    ++r.jobs;
    if (it->second.whole) r.exclusive = true;
    if (it->second.gpu_bytes < 0) {
      r.exclusive = true;
    } else {
      r.used_bytes += it->second.gpu_bytes;
    }
  }
  return rooms;
}

std::map<std::string, OwnerState> JobManager::OwnersLocked(int64_t now_ms) const {
  std::map<std::string, OwnerState> owners;
  const QuotaConfig& q = cfg_.quotas;
  queue_.ForEach([&](const QueuedJob& j) {
    owners.try_emplace(j.owner);
    return true;
  });
  for (const auto& [slot, use] : slot_use_) {
    if (!use.primary) continue;  // a job's other GPUs
    if (auto it = owners.find(use.owner); it != owners.end()) ++it->second.running;
  }
  for (auto& [name, o] : owners) {
    if (q.half_life_ms > 0) o.usage = usage_.Decayed(name, now_ms, q.half_life_ms);
    const UserLimits& l = q.For(name);
    o.max_running = static_cast<int>(l.max_running);
    if (l.gpu_hours > 0) {
      const double used = usage_.GpuHours(name, now_ms - q.window_ms, now_ms);
      if (used >= l.gpu_hours) {
        o.held = absl::StrFormat("user %s has used %.1f %s in the last %s, the limit for the user "
                                 "(gpu-hours=%g): the user's jobs start once older use leaves the window",
                                 name, used, UsageUnit(), HoursText(q.window_ms), l.gpu_hours);
      }
    }
  }
  return owners;
}

void JobManager::PublishGpusLocked() {
  if (cfg_.gpus <= 0) return;
  std::map<int, std::pair<int, int64_t>> gpus;  // gpu -> (jobs, predicted bytes)
  for (int g = 0; g < cfg_.gpus; ++g) gpus[g] = {0, 0};
  for (size_t i = 0; i < slots_.size(); ++i) {
    auto it = slot_use_.find(slots_[i]);
    if (it == slot_use_.end() || slot_gpu_[i] < 0) continue;
    auto& [jobs, bytes] = gpus[slot_gpu_[i]];
    ++jobs;
    bytes += std::max<int64_t>(it->second.gpu_bytes, 0);
  }
  for (const auto& [g, v] : gpus) metrics_->GpuShare(g, v.first, v.second);
}

// Fills in what only the running daemon knows: the queue position and why a queued job waits.
// Needs view_mu_ only: a read does not wait for a commit another call holds mu_ across.
JobManager::QueueView JobManager::QueueViewLocked() const {
  QueueView v;
  if (queue_.size() == 0) return v;
  v.owners = OwnersLocked(clock_->UnixMs());
  v.spots = QueueSpots(queue_, &v.owners);
  return v;
}

namespace {

std::string Size(int64_t b) { return ftd::spec::FormatBytes(static_cast<double>(b)); }

}  // namespace

void JobManager::AnnotateLocked(Job* job, const QueueView& view) const {
  job->set_queue_position(0);
  if (auto it = phases_.find(job->id()); it != phases_.end() && job->state() == ftd::v1::RUNNING) {
    *job->mutable_phase() = it->second;
  }
  if (job->state() != ftd::v1::QUEUED) return;
  auto spot_it = view.spots.find(job->id());
  const QueueSpot spot = spot_it != view.spots.end() ? spot_it->second : QueueSpot{queue_.Position(job->id()), 0, 0};
  job->set_queue_position(spot.position);
  const int64_t now = clock_->UnixMs();
  if (job->not_before_unix_ms() > now) {
    job->set_message(absl::StrCat(job->message(), absl::StrFormat(" (retry in %.1fs)",
                                                                  (job->not_before_unix_ms() - now) / 1000.0)));
    return;
  }
  const QuotaConfig& q = cfg_.quotas;
  auto owner_it = view.owners.find(job->owner());
  const OwnerState owner = owner_it != view.owners.end() ? owner_it->second : OwnerState{};
  std::string reason = "WAITING_FOR_SLOT", why;
  if (paused_) {
    reason = "PAUSED";
    why = "the scheduler is paused (ftctl resume starts it): no job starts; ";
  } else if (!owner.held.empty()) {
    reason = "QUOTA";
    why = owner.held + "; ";
  } else if (owner.max_running > 0 && owner.running >= owner.max_running) {
    reason = "QUOTA";
    why = absl::StrCat("user ", job->owner(), " runs ", owner.running, " job(s), the limit for the user (running=",
                       owner.max_running, "); ");
  } else if (waits_for_gpus_ == job->id()) {
    reason = "WAITING_FOR_GPUS";
    why = absl::StrCat("waits for ", SlotsNeeded(job->spec()), " free GPUs at once (spec.gpus; ",
                       WholeFreeGpus(RoomsLocked()).size(), " with no job on them now); ");
  } else if (waits_for_memory_ == job->id()) {
    reason = "WAITING_FOR_MEMORY";
    int64_t most = 0;
    for (const GpuRoom& r : RoomsLocked()) {
      if (!r.free_slots.empty() && !r.exclusive) {
        most = std::max(most, r.jobs == 0 ? r.capacity_bytes : r.capacity_bytes - r.used_bytes - cfg_.gpu_margin_bytes);
      }
    }
    why = absl::StrCat("it fits on no GPU now: predicted peak ",
                       job->predicted_peak_bytes() > 0 ? Size(job->predicted_peak_bytes()) : "unknown (a GPU of its own)",
                       ", the most free on a GPU with a free slot ", Size(std::max<int64_t>(most, 0)), " (less a margin of ",
                       Size(cfg_.gpu_margin_bytes), " when shared); ");
  }
  std::string ahead = absl::StrCat(std::max<int64_t>(spot.position - 1, 0), " job(s) ahead in the queue");
  if (q.half_life_ms > 0 && spot.position > 1) {
    absl::StrAppend(&ahead, " (", spot.ahead_higher_priority, " of higher priority, ", spot.ahead_lower_usage,
                    " of users with lower recent ", cfg_.gpus > 0 ? "GPU usage)" : "usage)");
  }
  std::string usage;
  if (q.half_life_ms > 0 || q.For(job->owner()).gpu_hours > 0) {
    usage = absl::StrFormat("; user %s has %.1f %s in the last %s", job->owner(),
                            usage_.GpuHours(job->owner(), now - q.window_ms, now), UsageUnit(), HoursText(q.window_ms));
    if (q.half_life_ms > 0) {
      absl::StrAppendFormat(&usage, " (fair-share usage %.2f, half-life %s)", owner.usage, HoursText(q.half_life_ms));
    }
  }
  job->set_reason(reason);
  job->set_message(absl::StrCat(why, ahead, usage, "; ", slot_use_.size(), " of ", slots_.size(), " slot(s) busy"));
}

std::string JobManager::PlacementLocked(const Job& job) const {
  QueuedJob probe;
  probe.owner = job.owner();
  probe.gpu_bytes = job.spec().device() == "cpu" ? 0 : job.predicted_peak_bytes() > 0 ? job.predicted_peak_bytes() : -1;
  const std::vector<GpuRoom> rooms = RoomsLocked();
  const int b = BestRoom(rooms, probe.gpu_bytes, cfg_.gpu_margin_bytes);
  const GpuRoom* best = b < 0 ? nullptr : &rooms[b];
  const std::string queued = queue_.size() > 0 ? absl::StrCat(" once the ", queue_.size(), " queued job(s) ahead of it have had their turn") : "";
  if (const int need = SlotsNeeded(job.spec()); need > 1) {
    const auto whole = WholeFreeGpus(rooms);
    if (whole.size() < static_cast<size_t>(need)) {
      return absl::StrCat("it would wait for ", need, " free GPUs at once (", whole.size(), " with no job on them now)",
                          queued.empty() ? "" : ", and" + queued);
    }
    std::vector<int> gpus;
    for (size_t k = 0; k < static_cast<size_t>(need); ++k) gpus.push_back(rooms[whole[k]].gpu);
    return absl::StrCat("it would start on GPUs ", absl::StrJoin(gpus, ","), queued.empty() ? " now" : queued);
  }
  if (best == nullptr) {
    if (cfg_.gpus <= 0) return absl::StrCat("the CPU slot is busy: it would wait for it", queued.empty() ? "" : ", and" + queued);
    return absl::StrCat("no slot fits it now: it would wait for a slot", probe.gpu_bytes > 0 ? " with enough GPU memory" : "",
                        queued.empty() ? "" : ", and" + queued);
  }
  std::string where = best->gpu < 0 ? std::string("the CPU slot") : absl::StrCat("GPU ", best->gpu);
  if (best->gpu >= 0 && best->capacity_bytes > 0) {
    absl::StrAppend(&where, " (", best->jobs, " job(s) on it, predicted ", Size(best->used_bytes + std::max<int64_t>(probe.gpu_bytes, 0)),
                    " of ", Size(best->capacity_bytes), " in use with this one)");
  }
  return absl::StrCat("it would start on ", where, queued.empty() ? " now" : queued);
}

absl::StatusOr<Job> JobManager::Get(const std::string& id) {
  auto job = store_->Get(id);
  if (!job.ok()) return job.status();
  std::lock_guard<std::mutex> view(view_mu_);
  AnnotateLocked(&*job, job->state() == ftd::v1::QUEUED ? QueueViewLocked() : QueueView{});
  return job;
}

absl::StatusOr<ftd::v1::ListJobsResponse> JobManager::List(const ftd::v1::ListJobsRequest& req) {
  JobFilter f;
  for (int s : req.states()) f.states.push_back(static_cast<ftd::v1::JobState>(s));
  f.owner = req.owner();
  f.kind = req.kind();
  f.newest_first = req.newest_first();
  if (req.page_size() < 0 || req.page_size() > 500) {
    return absl::InvalidArgumentError(absl::StrCat("page_size must be in [1, 500], or 0 for 50 (got ", req.page_size(), ")"));
  }
  f.limit = req.page_size() == 0 ? 50 : req.page_size();
  if (!req.page_token().empty()) {
    try {
      size_t used = 0;
      f.after_seq = std::stoll(req.page_token(), &used);
      if (used != req.page_token().size() || f.after_seq < 0) throw std::invalid_argument("token");
    } catch (const std::exception&) {
      return absl::InvalidArgumentError("page_token is not one this ftd issued; pass next_page_token unchanged");
    }
  }
  int64_t next = 0;
  auto jobs = store_->List(f, &next);
  if (!jobs.ok()) return jobs.status();
  ftd::v1::ListJobsResponse resp;
  std::lock_guard<std::mutex> view(view_mu_);
  const bool any_queued =
      std::any_of(jobs->begin(), jobs->end(), [](const Job& j) { return j.state() == ftd::v1::QUEUED; });
  const QueueView qv = any_queued ? QueueViewLocked() : QueueView{};
  for (auto& j : *jobs) {
    AnnotateLocked(&j, qv);
    *resp.add_jobs() = std::move(j);
  }
  if (next > 0) resp.set_next_page_token(absl::StrCat(next));
  return resp;
}

}  // namespace ftd::server

// The queued jobs in scheduling order (priority descending, then submission order), kept in memory:
// rebuilt from the store at start and updated on submit, start, cancel and retry. A job's position
// costs O(log n) (an order-statistics tree), so annotating a page of ListJobs costs O(page log n),
// not O(queue) per job.
#pragma once

#include <algorithm>
#include <cstdint>
#include <ext/pb_ds/assoc_container.hpp>
#include <ext/pb_ds/tree_policy.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "ftd/v1/jobs.pb.h"

namespace ftd::server {

struct QueuedJob {
  std::string id;
  int32_t priority = 0;
  int64_t seq = 0;            // submission order (the number in the job id)
  int64_t not_before_ms = 0;  // a retry waits for its backoff until then (unix ms)
  std::string owner;
  // Predicted GPU memory (Job.predicted_peak_bytes): 0 for a job on the CPU, -1 when unknown.
  int64_t gpu_bytes = -1;
  int gpus = 1;               // GPU slots it takes at once, all or none (spec.gpus; 1 on device "cpu")
};

// GPU slots a job takes at once: spec.gpus, or 1 for a CPU job (its ranks share the CPU slot).
inline int SlotsNeeded(const ftd::v1::TrainSpec& spec) {
  return spec.device() == "cpu" ? 1 : std::max(1, spec.gpus());
}

// The submission sequence encoded in a job id ("j-000042" -> 42; ids are "j-" and the store's
// AUTOINCREMENT key, at least six digits). nullopt for anything else.
std::optional<int64_t> SubmissionSeq(const std::string& id);

class JobQueue {
 public:
  // Adds or replaces the job (by id). Fails only for an id that is not a job id.
  bool Put(const ftd::v1::Job& job);
  bool Remove(const std::string& id);
  bool Contains(const std::string& id) const { return seq_of_.count(id) != 0; }
  const QueuedJob* Find(const std::string& id) const;
  // 1-based position in scheduling order; 0 when the job is not queued.
  int64_t Position(const std::string& id) const;
  size_t size() const { return by_seq_.size(); }

  // In-order traversal: f(const QueuedJob&) returns false to stop.
  template <typename F>
  void ForEach(F&& f) const {
    for (const auto& key : order_) {
      if (!f(by_seq_.at(key.second))) return;
    }
  }

 private:
  // (-priority, seq): ascending order is the scheduling order. The seq is unique.
  using Key = std::pair<int64_t, int64_t>;
  using Tree = __gnu_pbds::tree<Key, __gnu_pbds::null_type, std::less<Key>, __gnu_pbds::rb_tree_tag,
                                __gnu_pbds::tree_order_statistics_node_update>;
  static Key KeyOf(const QueuedJob& j) { return {-static_cast<int64_t>(j.priority), j.seq}; }
  Tree order_;
  std::unordered_map<int64_t, QueuedJob> by_seq_;
  std::unordered_map<std::string, int64_t> seq_of_;
};

}  // namespace ftd::server

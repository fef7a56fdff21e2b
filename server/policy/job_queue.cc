#include "server/policy/job_queue.h"

#include <charconv>

namespace ftd::server {

std::optional<int64_t> SubmissionSeq(const std::string& id) {
  if (id.size() < 8 || id.compare(0, 2, "j-") != 0) return std::nullopt;
  int64_t seq = 0;
  const char* end = id.data() + id.size();
  auto [p, ec] = std::from_chars(id.data() + 2, end, seq);
  if (ec != std::errc() || p != end || seq <= 0) return std::nullopt;
  return seq;
}

bool JobQueue::Put(const ftd::v1::Job& job) {
  const auto seq = SubmissionSeq(job.id());
  if (!seq.has_value()) return false;
  Remove(job.id());
  QueuedJob q{job.id(), job.priority(), *seq, job.not_before_unix_ms(), job.owner(), -1, SlotsNeeded(job.spec())};
  if (job.spec().device() == "cpu") {
    q.gpu_bytes = 0;
  } else if (job.predicted_peak_bytes() > 0) {
    q.gpu_bytes = job.predicted_peak_bytes();
  }
  order_.insert(KeyOf(q));
  seq_of_[q.id] = q.seq;
  by_seq_.emplace(q.seq, std::move(q));
  return true;
}

bool JobQueue::Remove(const std::string& id) {
  auto it = seq_of_.find(id);
  if (it == seq_of_.end()) return false;
  auto q = by_seq_.find(it->second);
  order_.erase(KeyOf(q->second));
  by_seq_.erase(q);
  seq_of_.erase(it);
  return true;
}

const QueuedJob* JobQueue::Find(const std::string& id) const {
  auto it = seq_of_.find(id);
  return it == seq_of_.end() ? nullptr : &by_seq_.at(it->second);
}

int64_t JobQueue::Position(const std::string& id) const {
  const QueuedJob* q = Find(id);
  return q == nullptr ? 0 : static_cast<int64_t>(order_.order_of_key(KeyOf(*q))) + 1;
}

}  // namespace ftd::server

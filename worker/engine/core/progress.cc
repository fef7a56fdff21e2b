#include "worker/engine/core/progress.h"

#include <algorithm>
#include <utility>

namespace ftd::engine {

const char* ProgressPhaseName(ProgressPhase p) {
  switch (p) {
    case ProgressPhase::kLoadWeights: return "load_weights";
    case ProgressPhase::kLoadData: return "load_data";
    case ProgressPhase::kLoadCheckpoint: return "load_checkpoint";
    case ProgressPhase::kSaveCheckpoint: return "save_checkpoint";
  }
  return "?";
}

ProgressMeter::ProgressMeter(ProgressFn fn, ProgressPhase phase, uint64_t total_bytes,
                             std::chrono::steady_clock::duration interval)
    : fn_(std::move(fn)), interval_(interval) {
  p_.phase = phase;
  p_.total_bytes = total_bytes;
  Report();
}

void ProgressMeter::Add(uint64_t bytes) {
  p_.done_bytes += bytes;
  if (fn_ && std::chrono::steady_clock::now() - last_ >= interval_) Report();
}

void ProgressMeter::Finish() {
  if (finished_) return;
  finished_ = true;
  p_.done_bytes = p_.total_bytes;
  Report();
}

void ProgressMeter::Report() {
  last_ = std::chrono::steady_clock::now();
  if (fn_) fn_(p_);
}

double WriteEta::Observe(const Progress& p, std::chrono::steady_clock::time_point now) {
  if (p.done_bytes == 0 || !writing_) {
    start_ = now;
    writing_ = true;
  }
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double left = static_cast<double>(p.total_bytes - std::min(p.done_bytes, p.total_bytes));
  if (p.total_bytes > 0 && p.done_bytes >= p.total_bytes) {
    if (elapsed > 0) rate_ = static_cast<double>(p.total_bytes) / elapsed;
    writing_ = false;
    return 0;
  }
  if (now - start_ >= settle_ && p.done_bytes > 0 && elapsed > 0) {
    return left / (static_cast<double>(p.done_bytes) / elapsed);
  }
  return rate_ > 0 ? left / rate_ : -1;
}

}  // namespace ftd::engine

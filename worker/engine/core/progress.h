// Progress of the long loads and writes outside training steps (weights, data, checkpoints), so
// that a watchdog can tell "slow but moving" from "stuck". No LibTorch.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

namespace ftd::engine {

enum class ProgressPhase {
  kLoadWeights,     // model.weights_path into the parameters
  kLoadData,        // opening the token file (or generating the embedded dataset)
  kLoadCheckpoint,  // weights and optimizer state of the checkpoint a run resumes from
  kSaveCheckpoint,  // writing a checkpoint
};
// "load_weights", "load_data", "load_checkpoint", "save_checkpoint".
const char* ProgressPhaseName(ProgressPhase p);

struct Progress {
  ProgressPhase phase = ProgressPhase::kLoadWeights;
  uint64_t done_bytes = 0;   // grows while the phase moves
  uint64_t total_bytes = 0;  // may grow too, as the phase opens what it has to read
  double eta_s = -1;         // kSaveCheckpoint: predicted seconds left (WriteEta); < 0: no estimate
};

using ProgressFn = std::function<void(const Progress&)>;

// Counts the bytes of one phase and passes them to `fn`: once at the start (done 0), then at most
// once per `interval` while bytes come in, and once at the end (done == total). An empty fn makes
// every call a no-op. Reports come from the thread that does the work.
class ProgressMeter {
 public:
  ProgressMeter(ProgressFn fn, ProgressPhase phase, uint64_t total_bytes,
                std::chrono::steady_clock::duration interval = std::chrono::milliseconds(250));
  ProgressMeter(const ProgressMeter&) = delete;
  ProgressMeter& operator=(const ProgressMeter&) = delete;

  void Add(uint64_t bytes);
  // Raises the total, for a phase that learns what it has to read as it opens its files.
  void AddTotal(uint64_t bytes) { p_.total_bytes += bytes; }
  // Reports done == total (once).
  void Finish();
  // A writer asks between pieces whether to give up (a plain cancel that came mid-write).
  void SetAbort(std::function<bool()> abort) { abort_ = std::move(abort); }
  bool Aborted() const { return abort_ && abort_(); }

 private:
  void Report();
  ProgressFn fn_;
  Progress p_;
  std::chrono::steady_clock::duration interval_;
  std::chrono::steady_clock::time_point last_;
  bool finished_ = false;
  std::function<bool()> abort_;
};

// Predicts how long the rest of a checkpoint write takes from its bytes and the measured write rate:
// this write's own rate once it has run for `settle` (before that the first bytes, landing in the
// page cache, look faster than the disk), else the rate of the previous complete write, else none.
// One per run: the rate carries from one checkpoint to the next.
class WriteEta {
 public:
  explicit WriteEta(std::chrono::steady_clock::duration settle = std::chrono::seconds(1)) : settle_(settle) {}
  // Seconds left of the write `p` reports, seen at `now` (< 0: no estimate yet). A report with done
  // 0 starts a write; done == total ends it and records its rate.
  double Observe(const Progress& p, std::chrono::steady_clock::time_point now);
  double bytes_per_s() const { return rate_; }  // of the last complete write; 0 before the first

 private:
  std::chrono::steady_clock::duration settle_;
  std::chrono::steady_clock::time_point start_{};
  bool writing_ = false;
  double rate_ = 0;
};

}  // namespace ftd::engine

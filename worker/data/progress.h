// A progress bar for long tokenization runs: on stderr, and only when stderr is a terminal.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace ftd::data {

class Progress {
 public:
  // `enabled` false, or stderr not a terminal, makes every call a no-op.
  Progress(std::string label, uint64_t total_bytes, bool enabled);
  ~Progress();  // ends the line
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Add(uint64_t bytes) { done_.fetch_add(bytes, std::memory_order_relaxed); }  // any thread
  void Draw();    // the owning thread, now and then
  void Finish();  // draws the final state and ends the line
  bool active() const { return active_; }

  static bool StderrIsTerminal();
  // The bar's text, e.g. "tokenizing  42% [=======>        ] 12.6/30.0 MB  25.1 MB/s  ETA 1s".
  static std::string Render(const std::string& label, uint64_t done, uint64_t total, double seconds, int width);

 private:
  std::string label_;
  uint64_t total_;
  bool active_;
  bool finished_ = false;
  std::atomic<uint64_t> done_{0};
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ftd::data

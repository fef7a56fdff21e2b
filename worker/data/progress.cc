#include "worker/data/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_format.h"

namespace ftd::data {

Progress::Progress(std::string label, uint64_t total_bytes, bool enabled)
    : label_(std::move(label)), total_(total_bytes), active_(enabled && StderrIsTerminal()),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { Finish(); }

bool Progress::StderrIsTerminal() { return ::isatty(STDERR_FILENO) == 1; }

std::string Progress::Render(const std::string& label, uint64_t done, uint64_t total, double seconds, int width) {
  const double frac = total == 0 ? 1.0 : std::min(1.0, static_cast<double>(done) / static_cast<double>(total));
  const int filled = static_cast<int>(frac * width);
  std::string bar(static_cast<size_t>(width), ' ');
  for (int i = 0; i < filled; ++i) bar[static_cast<size_t>(i)] = '=';
  if (filled < width && filled > 0) bar[static_cast<size_t>(filled)] = '>';
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
  std::string eta = "";
  if (rate > 0 && done < total) eta = absl::StrFormat("  ETA %.0fs", static_cast<double>(total - done) / rate);
  return absl::StrFormat("%s %3.0f%% [%s] %.1f/%.1f MB  %.1f MB/s%s", label, 100 * frac, bar,
                         static_cast<double>(done) / 1e6, static_cast<double>(total) / 1e6, rate / 1e6, eta);
}

void Progress::Draw() {
  if (!active_ || finished_) return;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const std::string line = Render(label_, done_.load(std::memory_order_relaxed), total_, s, 30);
  std::fprintf(stderr, "\r%s\033[K", line.c_str());
  std::fflush(stderr);
}

void Progress::Finish() {
  if (!active_ || finished_) return;
  Draw();
  finished_ = true;
  std::fputc('\n', stderr);
  std::fflush(stderr);
}

}  // namespace ftd::data

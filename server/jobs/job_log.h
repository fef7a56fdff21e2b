// Reading a job's log file as it grows, for GetLogs (ftctl logs [-f]). No gRPC here.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ftd::server {

class JobManager;

// Reads a file from an offset on, picking up what is appended later. A file that does not exist
// yet (the job has not started) reads as empty until it does.
class LogReader {
 public:
  // Starts at byte `offset` when > 0; else `tail_bytes` before the end of what exists now, at the
  // start of the next whole line, and at most `tail_lines` whole lines before the end (0 for both:
  // from the beginning).
  LogReader(std::string path, int64_t tail_bytes, int64_t offset = 0, int64_t tail_lines = 0);
  ~LogReader();
  LogReader(const LogReader&) = delete;
  LogReader& operator=(const LogReader&) = delete;
  // Up to `max` bytes not read before (empty: nothing new).
  std::string Read(size_t max);
  // Where the next Read starts in the file.
  int64_t position() const { return pos_; }

 private:
  bool Open();
  std::string path_;
  int64_t tail_;
  int64_t tail_lines_;
  int64_t pos_;
  FILE* f_ = nullptr;
};

// Streams job `id`'s log to `sink` (each chunk with its offset in the file) in chunks of at most
// 1 MiB, from `offset` when > 0, else from the last `tail_bytes` and `tail_lines`. Without `follow` it sends
// what the file holds now; with it, it goes on until the job has ended and every byte was sent,
// waking on the job's events and at least every 250 ms. Returns early when `sink` returns false or
// `stop` returns true (CANCELLED); NOT_FOUND for an unknown job.
absl::Status StreamJobLog(JobManager* m, const std::string& id, bool follow, int64_t tail_bytes, int64_t offset,
                          const std::function<bool(int64_t offset, std::string_view data)>& sink,
                          const std::function<bool()>& stop, int64_t tail_lines = 0);

}  // namespace ftd::server

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
  // Starts `tail_bytes` before the end of what exists now, at the start of the next whole line (0:
  // from the beginning).
  LogReader(std::string path, int64_t tail_bytes);
  ~LogReader();
  LogReader(const LogReader&) = delete;
  LogReader& operator=(const LogReader&) = delete;
  // Up to `max` bytes not read before (empty: nothing new).
  std::string Read(size_t max);

 private:
  bool Open();
  std::string path_;
  int64_t tail_;
  FILE* f_ = nullptr;
};

// Streams job `id`'s log to `sink` in chunks of at most 1 MiB. Without `follow` it sends what the
// file holds now; with it, it goes on until the job has ended and every byte was sent, waking on
// the job's events and at least every 250 ms. Returns early when `sink` returns false or `stop`
// returns true (CANCELLED); NOT_FOUND for an unknown job.
absl::Status StreamJobLog(JobManager* m, const std::string& id, bool follow, int64_t tail_bytes,
                          const std::function<bool(std::string_view)>& sink, const std::function<bool()>& stop);

}  // namespace ftd::server

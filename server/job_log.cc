#include "server/job_log.h"

#include "server/job_manager.h"

namespace ftd::server {

LogReader::LogReader(std::string path, int64_t tail_bytes) : path_(std::move(path)), tail_(tail_bytes) { Open(); }

LogReader::~LogReader() {
  if (f_ != nullptr) std::fclose(f_);
}

bool LogReader::Open() {
  if (f_ != nullptr) return true;
  f_ = std::fopen(path_.c_str(), "rbe");
  if (f_ == nullptr) return false;
  if (tail_ > 0 && std::fseek(f_, 0, SEEK_END) == 0) {
    const long size = std::ftell(f_);
    if (size > tail_) {
      std::fseek(f_, size - tail_ - 1, SEEK_SET);
      // Skip to the start of the next whole line (the byte before the window tells if one starts there).
      for (int c = std::fgetc(f_); c != EOF && c != '\n'; c = std::fgetc(f_)) {
      }
    } else {
      std::fseek(f_, 0, SEEK_SET);
    }
  }
  return true;
}

std::string LogReader::Read(size_t max) {
  if (!Open()) return {};
  std::string buf(max, '\0');
  const size_t n = std::fread(buf.data(), 1, max, f_);
  buf.resize(n);
  if (n < max) std::clearerr(f_);  // at the end for now: later reads see what is appended
  return buf;
}

absl::Status StreamJobLog(JobManager* m, const std::string& id, bool follow, int64_t tail_bytes,
                          const std::function<bool(std::string_view)>& sink, const std::function<bool()>& stop) {
  if (tail_bytes < 0) return absl::InvalidArgumentError("tail_bytes must be >= 0");
  auto sub = m->Subscribe(id);  // before the first read: nothing appended after it goes unnoticed
  auto log = m->Log(id);
  if (!log.ok()) return log.status();
  LogReader reader(log->path, tail_bytes);
  constexpr size_t kChunk = 1 << 20;
  for (;;) {
    if (stop()) return absl::CancelledError("stopped");
    // Whether the job had ended before this read: then what the read leaves is all there is.
    auto now = m->Log(id);
    if (!now.ok()) return now.status();
    const bool ended = now->ended;
    std::string data = reader.Read(kChunk);
    if (!data.empty()) {
      if (!sink(data)) return absl::CancelledError("client went away");
      continue;
    }
    if (!follow || ended) return absl::OkStatus();
    sub->WaitForNew(std::chrono::steady_clock::now() + std::chrono::milliseconds(250));
  }
}

}  // namespace ftd::server

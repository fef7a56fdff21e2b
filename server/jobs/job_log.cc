#include "server/jobs/job_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "server/jobs/job_manager.h"

namespace ftd::server {

namespace {

// Where the last `lines` whole lines of the `size`-byte file begin (a final line without its newline
// counts as one).
long StartOfLastLines(FILE* f, long size, int64_t lines) {
  constexpr long kBlock = 64 << 10;
  std::string buf(kBlock, '\0');
  // The newline that ends the file ends its last line: it starts no line after it.
  long end = size;
  if (end > 0 && std::fseek(f, end - 1, SEEK_SET) == 0 && std::fgetc(f) == '\n') --end;
  int64_t seen = 0;
  while (end > 0) {
    const long from = std::max(0L, end - kBlock);
    if (std::fseek(f, from, SEEK_SET) != 0) return 0;
    const size_t n = std::fread(buf.data(), 1, static_cast<size_t>(end - from), f);
    for (size_t i = n; i-- > 0;) {
      if (buf[i] == '\n' && ++seen == lines) return from + static_cast<long>(i) + 1;
    }
    end = from;
  }
  return 0;
}

}  // namespace

LogReader::LogReader(std::string path, int64_t tail_bytes, int64_t offset, int64_t tail_lines)
    : path_(std::move(path)),
      tail_(offset > 0 ? 0 : tail_bytes),
      tail_lines_(offset > 0 ? 0 : tail_lines),
      pos_(std::max<int64_t>(offset, 0)) {
  Open();
}

LogReader::~LogReader() {
  if (f_ != nullptr) std::fclose(f_);
}

bool LogReader::Open() {
  if (f_ != nullptr) return true;
  // Never through a link: the job's directory may belong to the workers' user (--worker-user).
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  f_ = ::fdopen(fd, "rb");
  if (f_ == nullptr) {
    ::close(fd);
    return false;
  }
  if (pos_ > 0) {
    // A resumed follow: where the previous stream stopped (past the end for now reads nothing yet).
    std::fseek(f_, static_cast<long>(pos_), SEEK_SET);
    return true;
  }
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
    pos_ = std::ftell(f_);
  }
  if (tail_lines_ > 0 && std::fseek(f_, 0, SEEK_END) == 0) {
    pos_ = std::max<int64_t>(pos_, StartOfLastLines(f_, std::ftell(f_), tail_lines_));
    std::fseek(f_, static_cast<long>(pos_), SEEK_SET);
  }
  return true;
}

std::string LogReader::Read(size_t max) {
  if (!Open()) return {};
  std::string buf(max, '\0');
  const size_t n = std::fread(buf.data(), 1, max, f_);
  buf.resize(n);
  pos_ += static_cast<int64_t>(n);
  if (n < max) std::clearerr(f_);  // at the end for now: later reads see what is appended
  return buf;
}

absl::Status StreamJobLog(JobManager* m, const std::string& id, bool follow, int64_t tail_bytes, int64_t offset,
                          const std::function<bool(int64_t, std::string_view)>& sink,
                          const std::function<bool()>& stop, int64_t tail_lines) {
  if (tail_bytes < 0) return absl::InvalidArgumentError("tail_bytes must be >= 0");
  if (tail_lines < 0) return absl::InvalidArgumentError("tail_lines must be >= 0");
  if (offset < 0) return absl::InvalidArgumentError("offset must be >= 0");
  auto sub = m->Subscribe(id);  // before the first read: nothing appended after it goes unnoticed
  auto log = m->Log(id);
  if (!log.ok()) return log.status();
  LogReader reader(log->path, tail_bytes, offset, tail_lines);
  constexpr size_t kChunk = 1 << 20;
  for (;;) {
    if (stop()) return absl::CancelledError("stopped");
    // Whether the job had ended before this read: then what the read leaves is all there is.
    auto now = m->Log(id);
    if (!now.ok()) return now.status();
    const bool ended = now->ended;
    const int64_t at = reader.position();
    std::string data = reader.Read(kChunk);
    if (!data.empty()) {
      if (!sink(at, data)) return absl::CancelledError("client went away");
      continue;
    }
    if (!follow || ended) return absl::OkStatus();
    sub->WaitForNew(std::chrono::steady_clock::now() + std::chrono::milliseconds(250));
  }
}

}  // namespace ftd::server

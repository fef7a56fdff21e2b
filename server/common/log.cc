#include "server/common/log.h"

#include <google/protobuf/stubs/logging.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "absl/strings/str_cat.h"
#include "spec/text.h"

namespace ftd::server {
namespace {

std::mutex sink_mu;
std::function<void(const std::string&)>* sink = nullptr;

}  // namespace

void WriteLogLine(std::string_view text) {
  const std::string line = absl::StrCat("ftd: ", spec::EscapeControl(text), "\n");
  std::lock_guard<std::mutex> l(sink_mu);
  if (sink != nullptr) {
    (*sink)(line);
    return;
  }
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

void SetLogSinkForTest(std::function<void(const std::string& line)> f) {
  std::lock_guard<std::mutex> l(sink_mu);
  delete sink;
  sink = f ? new std::function<void(const std::string&)>(std::move(f)) : nullptr;
}

bool RateLimitedLog::Write(std::string_view text, const std::string& key) {
  constexpr size_t kMaxKeys = 64;
  int64_t left_out = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    const int64_t now = clock_->SteadyMs();
    auto it = windows_.find(key);
    if (it == windows_.end()) {
      std::erase_if(windows_,
                    [&](const auto& kv) { return now - kv.second.start_ms >= 60'000 && kv.second.left_out == 0; });
      it = windows_.size() < kMaxKeys ? windows_.emplace(key, Window{now, 0, 0}).first
                                      : windows_.try_emplace("(others)", Window{now, 0, 0}).first;
    }
    Window& w = it->second;
    if (now - w.start_ms >= 60'000) {
      left_out = w.left_out;
      w = Window{now, 0, 0};
    }
    if (w.written >= per_minute_) {
      ++w.left_out;
      return false;
    }
    ++w.written;
  }
  if (left_out > 0) WriteLogLine(absl::StrCat(left_out, " more lines about ", kind_, " left out in the last minute"));
  WriteLogLine(text);
  return true;
}

namespace {

RateLimitedLog* protobuf_log = nullptr;

void ProtobufToLog(google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
  const char* what = level >= google::protobuf::LOGLEVEL_ERROR     ? "error"
                     : level == google::protobuf::LOGLEVEL_WARNING ? "warning"
                                                                   : "info";
  if (protobuf_log != nullptr) protobuf_log->Write(absl::StrCat("protobuf ", what, ": ", message));
}

}  // namespace

void RouteProtobufLog(const Clock* clock, int per_minute) {
  static auto* log = new RateLimitedLog("protobuf", per_minute, clock);  // lives as long as protobuf may log
  protobuf_log = log;
  google::protobuf::SetLogHandler(&ProtobufToLog);
}

}  // namespace ftd::server

// ftd's log: one line per event on stderr (the journal under systemd), each starting "ftd: ".
// Every line the daemon writes goes through FtdLog(): the whole line is written at once, and its
// control characters are escaped (spec/text.h), so text that came from users or workers (a job
// name, a path, a worker's message) can neither forge a line nor send a terminal escape.
//
// Lines that may come as fast as a client can cause them (a refused connection, protobuf's own
// messages about a request it could not parse) go through a RateLimitedLog: a burst per minute,
// then one line saying how many were left out.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>

#include "server/common/clock.h"

namespace ftd::server {

// Writes "ftd: " + `text` (escaped) + "\n" as one write.
void WriteLogLine(std::string_view text);

// FtdLog() << "job " << id << " submitted";  writes one line when the statement ends.
class LogLine {
 public:
  LogLine() = default;
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  ~LogLine() { WriteLogLine(text_.str()); }
  template <typename T>
  LogLine& operator<<(const T& v) {
    text_ << v;
    return *this;
  }

 private:
  std::ostringstream text_;
};
inline LogLine FtdLog() { return LogLine(); }

// Where log lines go instead of stderr while set (tests); nullptr restores stderr.
void SetLogSinkForTest(std::function<void(const std::string& line)> sink);

// Lines of one kind, at most `per_minute` in a minute for each key (a peer, say; at most 64 keys
// in a minute, the rest sharing one); the first line of a key after a minute in which some were left
// out says how many ("N more lines about KIND left out in the last minute").
class RateLimitedLog {
 public:
  RateLimitedLog(std::string kind, int per_minute, const Clock* clock)
      : kind_(std::move(kind)), per_minute_(per_minute), clock_(clock) {}
  // Returns whether the line was written.
  bool Write(std::string_view text, const std::string& key = "");

 private:
  struct Window {
    int64_t start_ms = 0;
    int written = 0;
    int64_t left_out = 0;
  };
  std::string kind_;
  int per_minute_;
  const Clock* clock_;
  std::mutex mu_;
  std::map<std::string, Window> windows_;  // by key
};

// Routes protobuf's own log messages (a request it could not parse, say) into ftd's log, at most
// `per_minute` a minute, instead of libprotobuf's unlimited lines on stderr. `clock` outlives the
// process's use of protobuf.
void RouteProtobufLog(const Clock* clock, int per_minute);

}  // namespace ftd::server

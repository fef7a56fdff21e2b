#include "server/process_metrics.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ftd::server {
namespace {

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::UnavailableError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

prometheus::MetricFamily One(std::string name, std::string help, prometheus::MetricType type, double v) {
  prometheus::MetricFamily f{std::move(name), std::move(help), type, {}};
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) m.counter.value = v; else m.gauge.value = v;
  f.metric.push_back(std::move(m));
  return f;
}

}  // namespace

absl::StatusOr<ProcessStats> ReadProcessStats(const std::string& proc) {
  ProcessStats s;
  auto stat = ReadAll(proc + "/self/stat");
  if (!stat.ok()) return stat.status();
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so fields count from the last ')'.
  const size_t close = stat->rfind(')');
  if (close == std::string::npos) return absl::DataLossError(absl::StrCat(proc, "/self/stat is not in the stat format"));
  const std::vector<std::string> f = absl::StrSplit(stat->substr(close + 2), ' ', absl::SkipEmpty());
  // f[0] is field 3 (state): field N is f[N - 3].
  int64_t utime = 0, stime = 0, start_ticks = 0, vsize = 0, rss_pages = 0;
  if (f.size() < 22 || !absl::SimpleAtoi(f[11], &utime) || !absl::SimpleAtoi(f[12], &stime) ||
      !absl::SimpleAtoi(f[19], &start_ticks) || !absl::SimpleAtoi(f[20], &vsize) || !absl::SimpleAtoi(f[21], &rss_pages)) {
    return absl::DataLossError(absl::StrCat(proc, "/self/stat has too few fields"));
  }
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  s.cpu_seconds = static_cast<double>(utime + stime) / ticks;
  s.virtual_bytes = vsize;
  s.resident_bytes = rss_pages * sysconf(_SC_PAGESIZE);
  auto sys = ReadAll(proc + "/stat");
  if (!sys.ok()) return sys.status();
  for (absl::string_view line : absl::StrSplit(*sys, '\n')) {
    int64_t btime = 0;
    if (absl::ConsumePrefix(&line, "btime ") && absl::SimpleAtoi(line, &btime)) {
      s.start_time_seconds = static_cast<double>(btime) + static_cast<double>(start_ticks) / ticks;
    }
  }
  std::error_code ec;
  for (std::filesystem::directory_iterator it(proc + "/self/fd", ec), end; !ec && it != end; it.increment(ec)) {
    ++s.open_fds;
  }
  if (auto limits = ReadAll(proc + "/self/limits"); limits.ok()) {
    for (absl::string_view line : absl::StrSplit(*limits, '\n')) {
      if (!absl::ConsumePrefix(&line, "Max open files")) continue;
      const std::vector<absl::string_view> v = absl::StrSplit(line, ' ', absl::SkipEmpty());
      int64_t soft = 0;
      if (!v.empty() && absl::SimpleAtoi(v[0], &soft)) s.max_fds = soft;
    }
  }
  return s;
}

ProcessCollector::ProcessCollector(std::string version, std::string commit, std::string proc)
    : version_(std::move(version)), commit_(std::move(commit)), proc_(std::move(proc)) {}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  prometheus::MetricFamily build{"ftd_build_info", "The ftd build that runs: its version and source commit (value 1)",
                                 MetricType::Gauge, {}};
  prometheus::ClientMetric info;
  info.label = {{"commit", commit_}, {"version", version_}};
  info.gauge.value = 1;
  build.metric.push_back(std::move(info));
  out.push_back(std::move(build));
  auto s = ReadProcessStats(proc_);
  if (!s.ok()) return out;
  out.push_back(One("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", MetricType::Counter,
                    s->cpu_seconds));
  out.push_back(One("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                    MetricType::Gauge, s->start_time_seconds));
  out.push_back(One("process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge,
                    static_cast<double>(s->resident_bytes)));
  out.push_back(One("process_virtual_memory_bytes", "Virtual memory size in bytes.", MetricType::Gauge,
                    static_cast<double>(s->virtual_bytes)));
  out.push_back(One("process_open_fds", "Number of open file descriptors.", MetricType::Gauge,
                    static_cast<double>(s->open_fds)));
  if (s->max_fds >= 0) {
    out.push_back(One("process_max_fds", "Maximum number of open file descriptors.", MetricType::Gauge,
                      static_cast<double>(s->max_fds)));
  }
  return out;
}

}  // namespace ftd::server

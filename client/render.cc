// How ftctl shows jobs (render.h): the list table, one job's description, durations, sizes and
// times as text, and the exit code a job's state gives. Event lines are in render_events.cc, the
// JSON form in render_json.cc, profile comparisons in render_profile.cc.
#include "client/render.h"

#include <algorithm>
#include <cmath>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "spec/bytes.h"
#include "spec/text.h"

namespace ftd::client {

using ftd::v1::Job;
using ftd::v1::JobEvent;

std::string Shown(absl::string_view s) { return ftd::spec::EscapeControl(std::string_view(s.data(), s.size())); }

double JobDurationS(const Job& j, int64_t now_unix_ms) {
  if (j.started_unix_ms() <= 0) return -1;
  const int64_t end = j.finished_unix_ms() > 0 ? j.finished_unix_ms() : now_unix_ms;
  return std::max<int64_t>(0, end - j.started_unix_ms()) / 1000.0;
}

std::string FormatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = static_cast<int64_t>(std::llround(s));
  if (t < 60) return absl::StrCat(t, "s");
  if (t < 3600) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%dh%02dm", t / 3600, (t % 3600) / 60);
}

std::string FormatBytes(uint64_t b) { return spec::FormatBytes(static_cast<double>(b)); }

std::string FormatTimeUtc(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%SZ", &tm);
  return buf;
}

int ExitCodeForState(ftd::v1::JobState s) {
  switch (s) {
    case ftd::v1::SUCCEEDED: return 0;
    case ftd::v1::FAILED: return 1;
    case ftd::v1::CANCELLED: return 2;
    default: return 3;
  }
}

namespace {

std::string KindName(ftd::v1::JobKind k) { return k == ftd::v1::PROFILE ? "profile" : "finetune"; }

// The GPU a running job is on ("gpu:N" or "gpu:N/k" slots); -1 otherwise.
int GpuOf(const Job& j) {
  if (j.state() != ftd::v1::RUNNING || j.slot().rfind("gpu:", 0) != 0) return -1;
  int g = -1;
  return absl::SimpleAtoi(j.slot().substr(4, j.slot().find('/') - 4), &g) ? g : -1;
}

std::string StepCell(const Job& j) {
  if (!j.has_last_step() || j.last_step().step() == 0) return "-";
  return absl::StrCat(j.last_step().step(), "/", j.last_step().total_steps());
}

}  // namespace

std::string JobsTable(const std::vector<Job>& jobs, int64_t now_unix_ms) {
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "STATE", "REASON", "KIND", "STEP", "LOSS", "AGE", "DURATION", "PRI", "OWNER", "GPU"}};
  std::map<int, int> on_gpu;  // running jobs of this list by GPU
  for (const auto& j : jobs) {
    if (const int g = GpuOf(j); g >= 0) ++on_gpu[g];
  }
  for (const auto& j : jobs) {
    const int g = GpuOf(j);
    std::string gpu = g < 0 ? "-" : absl::StrCat(g);
    if (g >= 0 && on_gpu[g] > 1) absl::StrAppend(&gpu, " (", on_gpu[g], " jobs)");
    const double run_s = JobDurationS(j, now_unix_ms);
    rows.push_back({Shown(j.id()), j.name().empty() ? "-" : Shown(j.name()), ftd::v1::JobState_Name(j.state()),
                    j.reason().empty() ? "-" : Shown(j.reason()), KindName(j.kind()), StepCell(j),
                    j.has_last_step() && j.last_step().step() > 0 ? absl::StrFormat("%.4f", j.last_step().loss()) : "-",
                    j.created_unix_ms() > 0 ? FormatDuration((now_unix_ms - j.created_unix_ms()) / 1000.0) : "-",
                    run_s < 0 ? "-" : FormatDuration(run_s), absl::StrCat(j.priority()), Shown(j.owner()), gpu});
  }
  return Table(rows);
}

std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    width.resize(std::max(width.size(), r.size()), 0);
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size()) line += std::string(width[c] - r[c].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string PhaseText(const ftd::v1::JobPhase& p) {
  std::string out = absl::StrCat(Shown(p.phase()), " after step ", p.after_step(), ": ",
                                 FormatBytes(static_cast<uint64_t>(std::max<int64_t>(p.done_bytes(), 0))), " of ",
                                 FormatBytes(static_cast<uint64_t>(std::max<int64_t>(p.total_bytes(), 0))));
  if (p.has_eta_s()) absl::StrAppend(&out, ", about ", FormatDuration(std::ceil(p.eta_s())), " left");
  return out;
}

std::string JobText(const Job& j, int64_t now_unix_ms) {
  std::vector<std::pair<std::string, std::string>> kv = {
      {"id", j.id()},
      {"name", j.name()},
      {"kind", KindName(j.kind())},
      {"owner", j.owner()},
      {"state", ftd::v1::JobState_Name(j.state())},
      {"reason", j.reason()},
      {"message", j.message()},
      {"priority", absl::StrCat(j.priority())},
      {"attempt", absl::StrCat(j.attempt(), " of ", j.max_attempts())},
  };
  if (j.state() == ftd::v1::QUEUED) kv.emplace_back("queue position", absl::StrCat(j.queue_position()));
  if (!j.slot().empty()) kv.emplace_back("slot", j.slot());
  if (j.predicted_peak_bytes() > 0) {
    kv.emplace_back("predicted peak", FormatBytes(static_cast<uint64_t>(j.predicted_peak_bytes())));
  }
  if (j.worker_pid() != 0) kv.emplace_back("worker pid", absl::StrCat(j.worker_pid()));
  kv.emplace_back("created", FormatTimeUtc(j.created_unix_ms()));
  if (j.started_unix_ms() > 0) kv.emplace_back("started", FormatTimeUtc(j.started_unix_ms()));
  if (j.finished_unix_ms() > 0) kv.emplace_back("finished", FormatTimeUtc(j.finished_unix_ms()));
  if (const double run_s = JobDurationS(j, now_unix_ms); run_s >= 0) {
    kv.emplace_back("duration", absl::StrCat(FormatDuration(run_s), j.finished_unix_ms() > 0 ? "" : " so far"));
  }
  if (j.has_phase() && !j.phase().phase().empty()) kv.emplace_back("phase", PhaseText(j.phase()));
  if (j.has_last_step() && j.last_step().step() > 0) {
    JobEvent e;
    *e.mutable_step() = j.last_step();
    kv.emplace_back("last step", EventLine(e));
  }
  if (j.has_result() && j.result().outcome() != ftd::v1::RunResult::OUTCOME_UNSPECIFIED) {
    kv.emplace_back("result", ResultText(j.result()));
    if (!j.result().last_checkpoint().empty()) kv.emplace_back("checkpoint", j.result().last_checkpoint());
  }
  if (!j.request_id().empty()) kv.emplace_back("request id", j.request_id());
  if (j.public_only()) {
    kv.emplace_back("private", absl::StrCat("the spec, messages, logs, trace and profile are visible to ", j.owner(),
                                            " and admins only"));
  }
  std::string out;
  for (const auto& [k, v] : kv) out += absl::StrFormat("%-15s %s\n", k + ":", v.empty() ? "-" : Shown(v));
  return out;
}

}  // namespace ftd::client

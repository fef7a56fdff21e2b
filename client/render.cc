#include "client/render.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ftd::client {

using ftd::v1::Job;
using ftd::v1::JobEvent;

std::string ToJson(const google::protobuf::Message& m, bool pretty) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  o.add_whitespace = pretty;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string FormatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = static_cast<int64_t>(std::llround(s));
  if (t < 60) return absl::StrCat(t, "s");
  if (t < 3600) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%dh%02dm", t / 3600, (t % 3600) / 60);
}

std::string FormatBytes(uint64_t b) {
  const double mib = static_cast<double>(b) / (1 << 20);
  if (mib < 1024) return absl::StrFormat("%.0f MiB", mib);
  return absl::StrFormat("%.1f GiB", mib / 1024);
}

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

std::string StepCell(const Job& j) {
  if (!j.has_last_step() || j.last_step().step() == 0) return "-";
  return absl::StrCat(j.last_step().step(), "/", j.last_step().total_steps());
}

}  // namespace

std::string JobsTable(const std::vector<Job>& jobs) {
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "STATE", "REASON", "KIND", "STEP", "LOSS", "PRI", "OWNER", "CREATED"}};
  for (const auto& j : jobs) {
    rows.push_back({j.id(), j.name().empty() ? "-" : j.name(), ftd::v1::JobState_Name(j.state()),
                    j.reason().empty() ? "-" : j.reason(), KindName(j.kind()), StepCell(j),
                    j.has_last_step() && j.last_step().step() > 0 ? absl::StrFormat("%.4f", j.last_step().loss()) : "-",
                    absl::StrCat(j.priority()), j.owner(), FormatTimeUtc(j.created_unix_ms())});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows) {
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

std::string JobText(const Job& j) {
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
  if (j.worker_pid() != 0) kv.emplace_back("worker pid", absl::StrCat(j.worker_pid()));
  kv.emplace_back("created", FormatTimeUtc(j.created_unix_ms()));
  if (j.started_unix_ms() > 0) kv.emplace_back("started", FormatTimeUtc(j.started_unix_ms()));
  if (j.finished_unix_ms() > 0) kv.emplace_back("finished", FormatTimeUtc(j.finished_unix_ms()));
  if (j.has_last_step() && j.last_step().step() > 0) {
    JobEvent e;
    *e.mutable_step() = j.last_step();
    kv.emplace_back("last step", EventLine(e));
  }
  if (j.has_result() && j.result().outcome() != ftd::v1::RunResult::OUTCOME_UNSPECIFIED) {
    kv.emplace_back("result", absl::StrCat(ftd::v1::RunResult::Outcome_Name(j.result().outcome()), ": ",
                                           j.result().message()));
    if (!j.result().last_checkpoint().empty()) kv.emplace_back("checkpoint", j.result().last_checkpoint());
  }
  if (!j.request_id().empty()) kv.emplace_back("request id", j.request_id());
  std::string out;
  for (const auto& [k, v] : kv) out += absl::StrFormat("%-15s %s\n", k + ":", v.empty() ? "-" : v);
  return out;
}

std::string EventLine(const JobEvent& e) {
  const std::string when = FormatTimeUtc(e.unix_ms());
  if (e.has_step()) {
    const auto& s = e.step();
    std::string line = absl::StrFormat("step %d/%d  loss %.4f  grad_norm %.3f  lr %.2e  %.0f tokens/s", s.step(),
                                       s.total_steps(), s.loss(), s.grad_norm(), s.lr(), s.tokens_per_s());
    if (s.peak_mem_allocated_bytes() > 0) {
      absl::StrAppend(&line, "  gpu ", FormatBytes(s.peak_mem_allocated_bytes()), " / ",
                      FormatBytes(s.peak_mem_reserved_bytes()), " reserved");
    } else if (s.peak_rss_bytes() > 0) {
      absl::StrAppend(&line, "  rss ", FormatBytes(s.peak_rss_bytes()));
    }
    if (s.mfu() > 0) absl::StrAppendFormat(&line, "  mfu %.1f%%", 100 * s.mfu());
    absl::StrAppend(&line, "  eta ", FormatDuration(static_cast<double>(s.total_steps() - s.step()) * s.step_time_s()));
    return line;
  }
  if (e.has_state()) {
    const auto& j = e.state();
    return absl::StrCat(when, "  ", ftd::v1::JobState_Name(j.state()), "  ", j.reason(),
                        j.message().empty() ? "" : absl::StrCat(": ", j.message()));
  }
  if (e.has_log()) return absl::StrCat(when, "  log: ", e.log());
  if (e.has_result()) {
    return absl::StrCat(when, "  result: ", ftd::v1::RunResult::Outcome_Name(e.result().outcome()),
                        e.result().message().empty() ? "" : absl::StrCat(": ", e.result().message()));
  }
  return absl::StrCat(when, "  (unknown event ", e.seq(), ")");
}

}  // namespace ftd::client

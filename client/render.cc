#include "client/render.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>
#include <tuple>

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

std::string CompareTable(const std::string& a_id, const ftd::v1::ProfileReport& a, const std::string& b_id,
                         const ftd::v1::ProfileReport& b, int top) {
  struct Pair {
    const ftd::v1::OpProfile* a = nullptr;
    const ftd::v1::OpProfile* b = nullptr;
  };
  std::map<std::tuple<std::string, std::string, std::string>, Pair> ops;  // (phase, op, category)
  for (const auto& o : a.ops()) ops[{o.phase(), o.name(), o.category()}].a = &o;
  for (const auto& o : b.ops()) ops[{o.phase(), o.name(), o.category()}].b = &o;
  std::vector<std::pair<std::tuple<std::string, std::string, std::string>, Pair>> rows(ops.begin(), ops.end());
  auto ms = [](const ftd::v1::OpProfile* o) { return o == nullptr ? 0.0 : o->device_ms(); };
  std::stable_sort(rows.begin(), rows.end(), [&](const auto& x, const auto& y) {
    return std::max(ms(x.second.a), ms(x.second.b)) > std::max(ms(y.second.a), ms(y.second.b));
  });
  const char* unit = a.device() == "cpu" && b.device() == "cpu" ? "CPU" : "device";
  std::string out = absl::StrFormat("A = %s (%s, %.1f ms %s time/step)   B = %s (%s, %.1f ms %s time/step)\n\n", a_id,
                                    a.kernel_set(), a.step_device_ms(), unit, b_id, b.kernel_set(),
                                    b.step_device_ms(), unit);
  absl::StrAppendFormat(&out, "%-48s %-9s %-13s %10s %10s %10s %8s %8s %8s\n", "op", "phase", "category", "A ms",
                        "B ms", "B-A ms", "B/A", "A calls", "B calls");
  auto cell = [](const ftd::v1::OpProfile* o, double v) { return o == nullptr ? std::string("-") : absl::StrFormat("%.3f", v); };
  int n = 0;
  for (const auto& [key, p] : rows) {
    if (top > 0 && n++ >= top) break;
    const double da = ms(p.a), db = ms(p.b);
    const auto& [phase, op, category] = key;
    std::string name = op.size() > 48 ? op.substr(0, 45) + "..." : op;
    absl::StrAppendFormat(&out, "%-48s %-9s %-13s %10s %10s %+10.3f %8s %8s %8s\n", name, phase, category, cell(p.a, da),
                          cell(p.b, db), db - da, da > 0 && p.b != nullptr ? absl::StrFormat("%.2fx", db / da) : "-",
                          p.a ? absl::StrFormat("%.0f", p.a->calls()) : "-",
                          p.b ? absl::StrFormat("%.0f", p.b->calls()) : "-");
  }
  std::map<std::string, std::pair<double, double>> cats;
  for (const auto& c : a.categories()) cats[c.category()].first = c.device_ms();
  for (const auto& c : b.categories()) cats[c.category()].second = c.device_ms();
  absl::StrAppendFormat(&out, "\n%-14s %10s %10s %10s\n", "category", "A ms", "B ms", "B-A ms");
  for (const auto& [c, v] : cats) {
    if (v.first == 0 && v.second == 0) continue;
    absl::StrAppendFormat(&out, "%-14s %10.3f %10.3f %+10.3f\n", c, v.first, v.second, v.second - v.first);
  }
  absl::StrAppendFormat(&out, "%-14s %10.3f %10.3f %+10.3f\n", "step", a.step_device_ms(), b.step_device_ms(),
                        b.step_device_ms() - a.step_device_ms());
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
    if (s.nvml_available()) absl::StrAppendFormat(&line, "  %.0f W  %.3f J/token", s.power_w(), s.joules_per_token());
    absl::StrAppend(&line, "  eta ", FormatDuration(static_cast<double>(s.total_steps() - s.step()) * s.step_time_s()));
    return line;
  }
  if (e.has_state()) {
    const auto& j = e.state();
    return absl::StrCat(when, "  ", ftd::v1::JobState_Name(j.state()), "  ", j.reason(),
                        j.message().empty() ? "" : absl::StrCat(": ", j.message()));
  }
  if (e.has_log()) return absl::StrCat(when, "  log: ", e.log());
  if (e.has_profile()) {
    return absl::StrFormat("%s  profile ready: %d op rows, %.1f ms %s time per step, trace %s", when,
                           e.profile().ops_size(), e.profile().step_device_ms(), e.profile().device() == "cpu" ? "CPU" : "device",
                           FormatBytes(static_cast<uint64_t>(e.profile().trace_bytes())));
  }
  if (e.has_result()) {
    return absl::StrCat(when, "  result: ", ftd::v1::RunResult::Outcome_Name(e.result().outcome()),
                        e.result().message().empty() ? "" : absl::StrCat(": ", e.result().message()));
  }
  return absl::StrCat(when, "  (unknown event ", e.seq(), ")");
}

}  // namespace ftd::client

#include "client/render.h"

#include <google/protobuf/util/json_util.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <map>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"

namespace ftd::client {

using ftd::v1::Job;
using ftd::v1::JobEvent;

namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using nlohmann::ordered_json;

bool Is64Bit(const FieldDescriptor* f) {
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT64: return true;
    default: return false;
  }
}

// proto3 JSON's "123" for a 64-bit integer -> 123.
void NumberFromString(const FieldDescriptor* f, ordered_json* v) {
  if (!v->is_string()) return;
  const std::string s = v->get<std::string>();
  try {
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64) {
      *v = static_cast<uint64_t>(std::stoull(s));
    } else {
      *v = static_cast<int64_t>(std::stoll(s));
    }
  } catch (const std::exception&) {
    // not a number: left as it is
  }
}

void Int64AsNumbers(const Descriptor* d, ordered_json* j) {
  if (!j->is_object()) return;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    auto it = j->find(f->name());
    if (it == j->end()) continue;
    if (f->is_map()) {
      const FieldDescriptor* value = f->message_type()->map_value();
      for (auto& [k, v] : it->items()) {
        if (value->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) Int64AsNumbers(value->message_type(), &v);
        else if (Is64Bit(value)) NumberFromString(value, &v);
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (auto& e : *it) Int64AsNumbers(f->message_type(), &e);
      } else {
        Int64AsNumbers(f->message_type(), &*it);
      }
    } else if (Is64Bit(f)) {
      if (f->is_repeated()) {
        for (auto& e : *it) NumberFromString(f, &e);
      } else {
        NumberFromString(f, &*it);
      }
    }
  }
}

}  // namespace

nlohmann::ordered_json ToJsonValue(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  ordered_json j = ordered_json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return ordered_json::object();
  Int64AsNumbers(m.GetDescriptor(), &j);
  return j;
}

std::string ToJson(const google::protobuf::Message& m, bool pretty) { return ToJsonValue(m).dump(pretty ? 2 : -1); }

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
    rows.push_back({j.id(), j.name().empty() ? "-" : j.name(), ftd::v1::JobState_Name(j.state()),
                    j.reason().empty() ? "-" : j.reason(), KindName(j.kind()), StepCell(j),
                    j.has_last_step() && j.last_step().step() > 0 ? absl::StrFormat("%.4f", j.last_step().loss()) : "-",
                    j.created_unix_ms() > 0 ? FormatDuration((now_unix_ms - j.created_unix_ms()) / 1000.0) : "-",
                    run_s < 0 ? "-" : FormatDuration(run_s), absl::StrCat(j.priority()), j.owner(), gpu});
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

std::string PhaseText(const ftd::v1::JobPhase& p) {
  std::string out = absl::StrCat(p.phase(), " after step ", p.after_step(), ": ",
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
    kv.emplace_back("result", absl::StrCat(ftd::v1::RunResult::Outcome_Name(j.result().outcome()), ": ",
                                           j.result().message()));
    if (!j.result().last_checkpoint().empty()) kv.emplace_back("checkpoint", j.result().last_checkpoint());
  }
  if (!j.request_id().empty()) kv.emplace_back("request id", j.request_id());
  std::string out;
  for (const auto& [k, v] : kv) out += absl::StrFormat("%-15s %s\n", k + ":", v.empty() ? "-" : v);
  return out;
}

namespace {

// One (phase, op, category) of a comparison; a side without the op has nullptr.
struct ComparedOp {
  std::string phase, op, category;
  const ftd::v1::OpProfile* a = nullptr;
  const ftd::v1::OpProfile* b = nullptr;
  double a_ms() const { return a == nullptr ? 0.0 : a->device_ms(); }
  double b_ms() const { return b == nullptr ? 0.0 : b->device_ms(); }
};

// The ops of both, largest time in either first; the `top` of them (0: all).
std::vector<ComparedOp> CompareOps(const ftd::v1::ProfileReport& a, const ftd::v1::ProfileReport& b, int top) {
  std::map<std::tuple<std::string, std::string, std::string>, ComparedOp> ops;  // (phase, op, category)
  for (const auto& o : a.ops()) ops[{o.phase(), o.name(), o.category()}].a = &o;
  for (const auto& o : b.ops()) ops[{o.phase(), o.name(), o.category()}].b = &o;
  std::vector<ComparedOp> rows;
  for (auto& [key, row] : ops) {
    std::tie(row.phase, row.op, row.category) = key;
    rows.push_back(row);
  }
  std::stable_sort(rows.begin(), rows.end(), [](const ComparedOp& x, const ComparedOp& y) {
    return std::max(x.a_ms(), x.b_ms()) > std::max(y.a_ms(), y.b_ms());
  });
  if (top > 0 && rows.size() > static_cast<size_t>(top)) rows.resize(static_cast<size_t>(top));
  return rows;
}

// Per category with time in either: (A ms, B ms).
std::map<std::string, std::pair<double, double>> CompareCategories(const ftd::v1::ProfileReport& a,
                                                                   const ftd::v1::ProfileReport& b) {
  std::map<std::string, std::pair<double, double>> cats;
  for (const auto& c : a.categories()) cats[c.category()].first = c.device_ms();
  for (const auto& c : b.categories()) cats[c.category()].second = c.device_ms();
  std::erase_if(cats, [](const auto& kv) { return kv.second.first == 0 && kv.second.second == 0; });
  return cats;
}

}  // namespace

std::string CompareTable(const std::string& a_id, const ftd::v1::ProfileReport& a, const std::string& b_id,
                         const ftd::v1::ProfileReport& b, int top) {
  const char* unit = a.device() == "cpu" && b.device() == "cpu" ? "CPU" : "device";
  std::string out = absl::StrFormat("A = %s (%s, %.1f ms %s time/step)   B = %s (%s, %.1f ms %s time/step)\n\n", a_id,
                                    a.kernel_set(), a.step_device_ms(), unit, b_id, b.kernel_set(),
                                    b.step_device_ms(), unit);
  absl::StrAppendFormat(&out, "%-48s %-9s %-13s %10s %10s %10s %8s %8s %8s\n", "op", "phase", "category", "A ms",
                        "B ms", "B-A ms", "B/A", "A calls", "B calls");
  auto cell = [](const ftd::v1::OpProfile* o, double v) { return o == nullptr ? std::string("-") : absl::StrFormat("%.3f", v); };
  for (const auto& r : CompareOps(a, b, top)) {
    const double da = r.a_ms(), db = r.b_ms();
    std::string name = r.op.size() > 48 ? r.op.substr(0, 45) + "..." : r.op;
    absl::StrAppendFormat(&out, "%-48s %-9s %-13s %10s %10s %+10.3f %8s %8s %8s\n", name, r.phase, r.category,
                          cell(r.a, da), cell(r.b, db), db - da,
                          da > 0 && r.b != nullptr ? absl::StrFormat("%.2fx", db / da) : "-",
                          r.a ? absl::StrFormat("%.0f", r.a->calls()) : "-",
                          r.b ? absl::StrFormat("%.0f", r.b->calls()) : "-");
  }
  absl::StrAppendFormat(&out, "\n%-14s %10s %10s %10s\n", "category", "A ms", "B ms", "B-A ms");
  for (const auto& [c, v] : CompareCategories(a, b)) {
    absl::StrAppendFormat(&out, "%-14s %10.3f %10.3f %+10.3f\n", c, v.first, v.second, v.second - v.first);
  }
  absl::StrAppendFormat(&out, "%-14s %10.3f %10.3f %+10.3f\n", "step", a.step_device_ms(), b.step_device_ms(),
                        b.step_device_ms() - a.step_device_ms());
  return out;
}

nlohmann::ordered_json CompareJson(const std::string& a_id, const ftd::v1::ProfileReport& a, const std::string& b_id,
                                   const ftd::v1::ProfileReport& b, int top) {
  using nlohmann::ordered_json;
  auto side = [](const std::string& id, const ftd::v1::ProfileReport& p) {
    return ordered_json{{"id", id}, {"kernel_set", p.kernel_set()}, {"device", p.device()}, {"step_ms", p.step_device_ms()}};
  };
  ordered_json j{{"a", side(a_id, a)}, {"b", side(b_id, b)}, {"ops", ordered_json::array()},
                 {"categories", ordered_json::array()}};
  auto or_null = [](const ftd::v1::OpProfile* o, double v) { return o == nullptr ? ordered_json() : ordered_json(v); };
  for (const auto& r : CompareOps(a, b, top)) {
    j["ops"].push_back({{"op", r.op}, {"phase", r.phase}, {"category", r.category}, {"a_ms", or_null(r.a, r.a_ms())},
                        {"b_ms", or_null(r.b, r.b_ms())}, {"diff_ms", r.b_ms() - r.a_ms()},
                        {"ratio", r.a_ms() > 0 && r.b != nullptr ? ordered_json(r.b_ms() / r.a_ms()) : ordered_json()},
                        {"a_calls", r.a ? ordered_json(r.a->calls()) : ordered_json()},
                        {"b_calls", r.b ? ordered_json(r.b->calls()) : ordered_json()}});
  }
  for (const auto& [c, v] : CompareCategories(a, b)) {
    j["categories"].push_back({{"category", c}, {"a_ms", v.first}, {"b_ms", v.second}, {"diff_ms", v.second - v.first}});
  }
  return j;
}

namespace {

double EtaSeconds(const ftd::v1::StepReport& s, double smoothed_step_time_s) {
  const double per_step = smoothed_step_time_s > 0 ? smoothed_step_time_s : s.step_time_s();
  return static_cast<double>(std::max<int64_t>(0, s.total_steps() - s.step())) * per_step;
}

// The fields of a step line, most important first.
std::vector<std::string> StepFields(const ftd::v1::StepReport& s, double smoothed_step_time_s) {
  std::vector<std::string> f = {absl::StrFormat("step %d/%d", s.step(), s.total_steps()),
                                absl::StrFormat("loss %.4f", s.loss()),
                                absl::StrCat("eta ", FormatDuration(EtaSeconds(s, smoothed_step_time_s))),
                                absl::StrFormat("%.0f tokens/s", s.tokens_per_s())};
  if (s.peak_mem_allocated_bytes() > 0) {
    f.push_back(absl::StrCat("gpu ", FormatBytes(s.peak_mem_allocated_bytes()), " / ",
                             FormatBytes(s.peak_mem_reserved_bytes()), " reserved"));
  } else if (s.peak_rss_bytes() > 0) {
    f.push_back(absl::StrCat("rss ", FormatBytes(s.peak_rss_bytes())));
  }
  f.push_back(absl::StrFormat("grad_norm %.3f", s.grad_norm()));
  f.push_back(absl::StrFormat("lr %.2e", s.lr()));
  if (s.mfu() > 0) f.push_back(absl::StrFormat("mfu %.1f%%", 100 * s.mfu()));
  if (s.nvml_available()) f.push_back(absl::StrFormat("%.0f W  %.3f J/token", s.power_w(), s.joules_per_token()));
  return f;
}

}  // namespace

void StepTimeEwma::Add(const ftd::v1::StepReport& s) {
  if (s.step() <= last_step_ || !(s.step_time_s() > 0) || !std::isfinite(s.step_time_s())) return;
  last_step_ = s.step();
  value_ = value_ < 0 ? s.step_time_s() : alpha_ * s.step_time_s() + (1 - alpha_) * value_;
}

std::string LiveStepLine(const ftd::v1::StepReport& s, double smoothed_step_time_s, int width) {
  const size_t max = static_cast<size_t>(std::max(width, 2) - 1);
  std::string line;
  for (const auto& field : StepFields(s, smoothed_step_time_s)) {
    const size_t add = (line.empty() ? 0 : 2) + field.size();
    if (line.size() + add > max) {
      if (line.empty()) line = field.substr(0, max);
      continue;  // a shorter field further on may still fit
    }
    if (!line.empty()) line += "  ";
    line += field;
  }
  return line;
}

int TerminalColumns(int fd) {
  winsize ws{};
  if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS"); c != nullptr) {
    int n = 0;
    if (absl::SimpleAtoi(c, &n) && n > 0) return n;
  }
  return 80;
}

std::string EventLine(const JobEvent& e, double smoothed_step_time_s) {
  const std::string when = FormatTimeUtc(e.unix_ms());
  if (e.has_step()) return absl::StrJoin(StepFields(e.step(), smoothed_step_time_s), "  ");
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

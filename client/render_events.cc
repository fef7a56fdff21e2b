// One line per watched event (render.h): a step's fields, most important first, with the worker's
// ETA; the live step line fitted to the terminal's width; log lines, state changes and results.
#include "client/render.h"

#include <sys/ioctl.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ftd::client {

using ftd::v1::JobEvent;

double StepEtaSeconds(const ftd::v1::StepReport& s) {
  if (s.has_eta_s()) return s.eta_s();
  return static_cast<double>(std::max<int64_t>(0, s.total_steps() - s.step())) * s.step_time_s();
}

namespace {

// The fields of a step line, most important first.
std::vector<std::string> StepFields(const ftd::v1::StepReport& s) {
  std::vector<std::string> f = {absl::StrFormat("step %d/%d", s.step(), s.total_steps()),
                                absl::StrFormat("loss %.4f", s.loss())};
  if (s.has_eval_loss()) f.push_back(absl::StrFormat("eval_loss %.4f", s.eval_loss()));
  f.push_back(absl::StrCat("eta ", FormatDuration(StepEtaSeconds(s))));
  f.push_back(absl::StrFormat("%.0f tokens/s", s.tokens_per_s()));
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

std::string LiveStepLine(const ftd::v1::StepReport& s, int width) {
  const size_t max = static_cast<size_t>(std::max(width, 2) - 1);
  std::string line;
  for (const auto& field : StepFields(s)) {
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

std::string ResultText(const ftd::v1::RunResult& r) {
  std::string out = ftd::v1::RunResult::Outcome_Name(r.outcome());
  if (!r.message().empty()) absl::StrAppend(&out, ": ", r.message());
  if (r.has_final_eval_loss()) absl::StrAppendFormat(&out, "; final_eval_loss %.4f", r.final_eval_loss());
  return out;
}

namespace {

// The event as text, before Shown (render.h) escapes what came from the job.
std::string EventText(const JobEvent& e) {
  const std::string when = FormatTimeUtc(e.unix_ms());
  if (e.has_step()) return absl::StrJoin(StepFields(e.step()), "  ");
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
  if (e.has_result()) return absl::StrCat(when, "  result: ", ResultText(e.result()));
  return absl::StrCat(when, "  (unknown event ", e.seq(), ")");
}

}  // namespace

std::string EventLine(const JobEvent& e) { return Shown(EventText(e)); }

}  // namespace ftd::client

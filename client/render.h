// How ftctl shows jobs and events: the list table, the job description, one line per watched event,
// and the JSON forms. Pure functions of the messages (no clock): a watch interrupted and resumed
// prints exactly what an uninterrupted one prints.
// Defined in render.cc (jobs), render_events.cc (event lines), render_json.cc (JSON) and
// render_profile.cc (profile comparisons).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "ftd/v1/jobs.pb.h"
#include "nlohmann/json.hpp"

namespace ftd::client {

// `s` as a terminal may show it: control characters written as escapes ("\n", "\x1b"; spec/text.h),
// so that a job name, a message or a log line can neither split a table nor move the cursor, clear
// the screen or retitle the window. Every table and line ftctl prints from text it did not write
// itself goes through it.
std::string Shown(absl::string_view s);

// proto3 JSON with the .proto field names and every scalar present (stable keys for scripts), in
// field order; 64-bit integers are JSON numbers (proto3 JSON writes them as strings), as in
// ftd-worker's output.
nlohmann::ordered_json ToJsonValue(const google::protobuf::Message& m);
std::string ToJson(const google::protobuf::Message& m, bool pretty);

// How long a job has run: started to finished, or to `now_unix_ms` while it runs; < 0 if it never started.
double JobDurationS(const ftd::v1::Job& job, int64_t now_unix_ms);

// Rows of cells as a table, each column as wide as its widest cell, two spaces between columns.
std::string Table(const std::vector<std::vector<std::string>>& rows);

// A table: ID NAME STATE REASON KIND STEP LOSS AGE DURATION PRI OWNER, columns sized to their
// content; AGE and DURATION are as of `now_unix_ms`.
std::string JobsTable(const std::vector<ftd::v1::Job>& jobs, int64_t now_unix_ms);
// A running job's long phase outside its steps: "save_checkpoint after step 4: 12.0 GiB of 48.0 GiB,
// about 26s left".
std::string PhaseText(const ftd::v1::JobPhase& p);
// "key: value" lines describing one job (its duration as of `now_unix_ms`); another user's job (its
// public row) ends with a line saying who may see the rest.
std::string JobText(const ftd::v1::Job& job, int64_t now_unix_ms);
// One line per event: state changes, steps (step/total, loss, the held-out loss where measured,
// ETA, tokens/s, memory, ...), logs, the result (with the final held-out loss).
std::string EventLine(const ftd::v1::JobEvent& e);
// A run's result as text: "SUCCEEDED: trained 30 steps; final_eval_loss 1.2345" (the held-out loss
// when the run had held-out data).
std::string ResultText(const ftd::v1::RunResult& r);
// The seconds left after a step report: the worker's ETA (StepReport.eta_s, computed once, where
// every reader shows the same), or for a report without one the steps left at that step's time.
double StepEtaSeconds(const ftd::v1::StepReport& s);

// The step line for a terminal `width` columns wide: step, loss, (eval_loss,) ETA, tokens/s, memory,
// then the rest, each field whole while it fits; shorter than `width` (a full last column would wrap
// on some terminals), cut if even the first field does not fit.
std::string LiveStepLine(const ftd::v1::StepReport& s, int width);

// Columns of the terminal on `fd` (TIOCGWINSZ), else $COLUMNS, else 80.
int TerminalColumns(int fd);

// Two profiles side by side, per (phase, op): device ms of A and B, the difference, calls; the
// `top` rows with the largest time in either (0: all), then the categories.
std::string CompareTable(const std::string& a_id, const ftd::v1::ProfileReport& a, const std::string& b_id,
                         const ftd::v1::ProfileReport& b, int top);
// The same as data: {"a": {id, kernel_set, step_ms}, "b": ..., "ops": [{op, phase, category, a_ms, b_ms,
// diff_ms, ratio, a_calls, b_calls}], "categories": [{category, a_ms, b_ms, diff_ms}]}; a side
// without the op has null.
nlohmann::ordered_json CompareJson(const std::string& a_id, const ftd::v1::ProfileReport& a, const std::string& b_id,
                                   const ftd::v1::ProfileReport& b, int top);

// Pieces, exposed for tests.
std::string FormatDuration(double seconds);  // "42s", "3m05s", "2h01m"
std::string FormatBytes(uint64_t bytes);     // "512 MiB", "1.5 GiB"
std::string FormatTimeUtc(int64_t unix_ms);  // "2026-11-22 18:44:55Z"

// Exit code of ftctl wait/watch/submit --wait for a job's final state: 0 SUCCEEDED, 1 FAILED,
// 2 CANCELLED (3 is reserved for "could not find out").
int ExitCodeForState(ftd::v1::JobState s);

}  // namespace ftd::client

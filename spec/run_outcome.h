// How a run ended, defined once. Each row: the enumerator, its name (the name of the matching
// ftd.v1.RunResult.Outcome value, which ToRunResult maps by, and the "outcome" of a standalone
// run's result line) and ftd-worker's exit code for it. The daemon decides a job's reason from the
// reported RunResult (server/policy/exit_classification.h: one exit rule per outcome).
// A new outcome: one row here, one value in RunResult.Outcome (proto/ftd/v1/job_spec.proto), one
// exit rule and reason in server/policy/exit_classification.h; tests fail until all three exist.
// No LibTorch, no protobuf.
#pragma once

#include <array>
#include <optional>
#include <string_view>

namespace ftd::spec {

// X(enumerator, NAME, exit code)
#define FTD_RUN_OUTCOMES(X)     \
  X(kSucceeded, SUCCEEDED, 0)   \
  X(kFailed, FAILED, 1)         \
  X(kInvalidSpec, INVALID_SPEC, 2) \
  X(kOutOfMemory, OUT_OF_MEMORY, 3) /* the GPU ran out of memory */ \
  X(kNonFinite, NON_FINITE, 4)  /* a non-finite loss or gradient norm stopped the run */ \
  X(kCancelled, CANCELLED, 5)   /* stopped on request (SIGTERM/SIGINT or a cancel) */

enum class Outcome {
#define FTD_OUTCOME_ENUMERATOR(e, name, code) e,
  FTD_RUN_OUTCOMES(FTD_OUTCOME_ENUMERATOR)
#undef FTD_OUTCOME_ENUMERATOR
};

struct OutcomeInfo {
  Outcome outcome;
  std::string_view name;
  int exit_code;
};

inline constexpr OutcomeInfo kOutcomes[] = {
#define FTD_OUTCOME_ROW(e, name, code) {Outcome::e, #name, code},
    FTD_RUN_OUTCOMES(FTD_OUTCOME_ROW)
#undef FTD_OUTCOME_ROW
};

inline constexpr const OutcomeInfo& InfoOf(Outcome o) { return kOutcomes[static_cast<size_t>(o)]; }
inline constexpr std::string_view OutcomeName(Outcome o) { return InfoOf(o).name; }
// ftd-worker's exit status for a run that ended so.
inline constexpr int ExitCode(Outcome o) { return InfoOf(o).exit_code; }
std::optional<Outcome> ParseOutcome(std::string_view name);

}  // namespace ftd::spec

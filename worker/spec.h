// The job spec's JSON mapping (proto/ftd/v1/job_spec.proto) and its translation to and from the
// engine's plain structs. No LibTorch.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "ftd/v1/job_spec.pb.h"
#include "worker/engine/engine.h"

namespace ftd::worker {

// Parses a TrainSpec from JSON; unknown fields and type errors are INVALID_ARGUMENT naming them.
absl::StatusOr<ftd::v1::TrainSpec> ParseTrainSpecJson(const std::string& json);
std::string TrainSpecToJson(const ftd::v1::TrainSpec& spec);
// Applies one command-line override "a.b=value" (a dotted field path in the JSON mapping, a JSON
// value or a bare string) through the JSON mapping, so it is checked like a spec file.
absl::Status ApplySetOverride(const std::string& assignment, ftd::v1::TrainSpec* spec);
// Applies defaults for unset fields and validates; errors name the field and the fix.
absl::StatusOr<engine::TrainConfig> ToTrainConfig(const ftd::v1::TrainSpec& spec);
ftd::v1::StepReport ToStepReport(const engine::StepMetrics& m);
ftd::v1::RunResult ToRunResult(const engine::RunSummary& s);
ftd::v1::ProfileReport ToProfileReport(const engine::ProfileSummary& p, const std::string& kernel_set);
// The per-op table as text: the `top` largest rows (0: all), per phase or all together.
std::string ProfileTable(const ftd::v1::ProfileReport& p, int top);
// The embedded default job: the tiny model on the arithmetic dataset on a CPU, the LLaMA-3.1-8B
// shape (random init, bf16) on a GPU.
ftd::v1::TrainSpec DefaultTrainSpec(bool gpu);

}  // namespace ftd::worker

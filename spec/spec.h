// The job spec's JSON mapping (proto/ftd/v1/job_spec.proto) and its translation to the validated
// TrainConfig that the worker runs. Shared by ftctl, ftd and ftd-worker; no LibTorch.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "ftd/v1/job_spec.pb.h"
#include "spec/train_config.h"

namespace ftd::spec {

// Parses a TrainSpec from JSON; unknown fields and type errors are INVALID_ARGUMENT naming them.
absl::StatusOr<ftd::v1::TrainSpec> ParseTrainSpecJson(const std::string& json);
// The set fields as JSON (.proto names, 64-bit integers as numbers), which ParseTrainSpecJson reads back.
std::string TrainSpecToJson(const ftd::v1::TrainSpec& spec);
// Applies one command-line override "a.b=value" (a dotted field path in the JSON mapping, a JSON
// value or a bare string) through the JSON mapping, so it is checked like a spec file.
absl::Status ApplySetOverride(const std::string& assignment, ftd::v1::TrainSpec* spec);
// Applies defaults for unset fields and checks every field on its own terms (TrainConfig::Validate);
// errors name the field and the fix.
absl::StatusOr<TrainConfig> ToTrainConfig(const ftd::v1::TrainSpec& spec);
// The one validation of a spec at a trust boundary: SubmitJob in ftd (against the daemon's
// Environment) and the start of ftd-worker (against its machine's). The wire checks (CheckMessage:
// unknown fields and enum values, non-finite numbers), ToTrainConfig, then CheckEnvironment.
absl::StatusOr<TrainConfig> Validate(const ftd::v1::TrainSpec& spec, const Environment& env);
// The kernel set a spec runs (eager, fused, or mixed with per-op overrides), for labels; the spec
// was validated before.
KernelSet KernelSetOf(const ftd::v1::TrainSpec& spec);
// The embedded default job: the tiny model on the arithmetic dataset on a CPU, the LLaMA-3.1-8B
// shape (random init, bf16) on a GPU.
ftd::v1::TrainSpec DefaultTrainSpec(bool gpu);

}  // namespace ftd::spec

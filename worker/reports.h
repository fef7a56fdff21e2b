// The engine's results as the protocol's messages (proto/ftd/v1/job_spec.proto): what the agent
// streams to ftd and what `ftd-worker profile --format json` prints. No LibTorch.
#pragma once

#include <string>

#include "ftd/v1/job_spec.pb.h"
#include "worker/engine/engine.h"

namespace ftd::worker {

// The RunResult value of the same name (spec/run_outcome.h).
ftd::v1::RunResult::Outcome ToProto(spec::Outcome o);
ftd::v1::StepReport ToStepReport(const engine::StepMetrics& m);
ftd::v1::RunResult ToRunResult(const engine::RunSummary& s);
ftd::v1::ProfileReport ToProfileReport(const engine::ProfileSummary& p, spec::KernelSet kernel_set);

}  // namespace ftd::worker

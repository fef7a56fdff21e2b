// The engine's results as the protocol's messages (proto/ftd/v1/job_spec.proto): what the agent
// streams to ftd and what `ftd-worker profile --format json` prints. No LibTorch.
#pragma once

#include <string>

#include "ftd/v1/job_spec.pb.h"
#include "worker/engine/engine.h"

namespace ftd::worker {

ftd::v1::StepReport ToStepReport(const engine::StepMetrics& m);
ftd::v1::RunResult ToRunResult(const engine::RunSummary& s);
ftd::v1::ProfileReport ToProfileReport(const engine::ProfileSummary& p, const std::string& kernel_set);

}  // namespace ftd::worker

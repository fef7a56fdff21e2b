// The job contract's plain types (spec/: the validated TrainConfig and the model's architecture)
// under the names the engine uses. No LibTorch, no protobuf.
#pragma once

#include "spec/llama_config.h"
#include "spec/run_outcome.h"
#include "spec/train_config.h"

namespace ftd::engine {

using spec::CheckpointConfig;
using spec::DataConfig;
using spec::KernelChoice;
using spec::KernelOp;
using spec::LearningRate;
using spec::LlamaConfig;
using spec::LoadLlamaConfig;
using spec::ModelSource;
using spec::OptimizerConfig;
using spec::PresetLlamaConfig;
using spec::ProfileConfig;
using spec::ScheduleConfig;
using spec::TrainConfig;

}  // namespace ftd::engine

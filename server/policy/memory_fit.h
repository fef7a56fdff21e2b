// The coarse bound at submit: a job whose predicted peak memory (spec/peak_memory.h) exceeds what a
// worker on this machine may use is refused, naming the field to lower and to what. What a worker
// may use comes from an injectable table, filled at start from the machine (main.cc) and by tests
// by hand, so the bound is tested on a CPU-only machine.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "spec/llama_config.h"
#include "spec/train_config.h"

namespace ftd::server {

struct MachineMemory {
  int64_t host_bytes = 0;  // what a CPU job may use: RAM, or the workers' memory limit if lower; 0: no bound
  int64_t gpu_bytes = 0;   // the smallest GPU's memory; 0: no bound
};

// RAM (MemTotal) of this host; 0 if it cannot be read.
int64_t HostMemoryBytes();

// The model the worker will build for `c` (docs/job-spec.md), for the bound only: nullopt when its
// config.json is not a regular file that can be read (the worker then says what is wrong).
std::optional<spec::LlamaConfig> ModelShape(const spec::TrainConfig& c, bool gpu);

// OK if the predicted peak fits in `m` (or the machine's capacity is unknown); else INVALID_ARGUMENT
// naming spec.batch_size (or spec.seq_len, or the model) and the largest value that fits.
absl::Status CheckMemoryFit(const spec::LlamaConfig& model, const spec::TrainConfig& c, bool gpu,
                            const MachineMemory& m);

}  // namespace ftd::server

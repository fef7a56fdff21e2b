// What the daemon asks CUDA about the machine's GPUs at start: how many there are, the smallest
// memory and the least compute capability among the first N (a job may get any of them). The only
// CUDA in ftd: the runtime's device queries, never a context of its own beyond them.
#pragma once

#include <cstdint>

namespace ftd::server {

// The CUDA device count; 0 when CUDA has none or fails.
int DetectGpus();
// The smallest memory of the first `gpus` GPUs; 0 if unknown.
int64_t GpuMemoryBytes(int gpus);
// major * 10 + minor of the least capable of the first `gpus` GPUs; 0 if unknown.
int GpuComputeCapability(int gpus);

}  // namespace ftd::server

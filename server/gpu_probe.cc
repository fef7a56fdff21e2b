// The GPU queries of gpu_probe.h, through the CUDA runtime API.
#include "server/gpu_probe.h"

#include <cuda_runtime_api.h>

#include <algorithm>

namespace ftd::server {

int DetectGpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

int64_t GpuMemoryBytes(int gpus) {
  int64_t least = 0;
  for (int i = 0; i < gpus; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) return 0;
    const auto total = static_cast<int64_t>(p.totalGlobalMem);
    least = least == 0 ? total : std::min(least, total);
  }
  return least;
}

int GpuComputeCapability(int gpus) {
  int least = 0;
  for (int i = 0; i < gpus; ++i) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, i) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, i) != cudaSuccess) {
      return 0;
    }
    least = least == 0 ? major * 10 + minor : std::min(least, major * 10 + minor);
  }
  return least;
}

}  // namespace ftd::server

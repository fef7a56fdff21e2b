#include "kernels/launch_plan.h"

#include <algorithm>

#include "kernels/common.h"

namespace ftd::kernels {

cudaError_t QueryDeviceProps(int device, DeviceProps* props) {
  int sms = 0, major = 0;
  cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it so the caller's next call does not report it
    return e;
  }
  props->device = device;
  props->sms = std::max(1, sms);
  props->cc_major = major;
  return cudaSuccess;
}

cudaError_t CurrentDeviceProps(DeviceProps* props) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
    cudaGetLastError();
    return e;
  }
  return QueryDeviceProps(device, props);
}

int64_t ResidentBlocks(const DeviceProps& dev, const void* kernel, int threads, size_t smem) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  return std::max<int64_t>(1, static_cast<int64_t>(dev.sms) * std::max(per_sm, 1));
}

int64_t BalancedGroups(int64_t rows, int64_t cap) {
  const int64_t groups = std::max<int64_t>(1, std::min(rows, cap));
  return CeilDiv(rows, CeilDiv(rows, groups));
}

RingPlan PlanRing(const DeviceProps& dev, const void* kernel, int threads, int stage_bytes, RingBudget budget) {
  RingPlan p;
  p.stage_bytes = stage_bytes;
  int by_regs = 0, per_sm = 0;
  // The largest shared-memory carveout: the one ring kernels need, so that consecutive launches of them
  // (and of kernels given PreferMaxShared) find the multiprocessors already configured.
  if (dev.HasBulkCopy() && stage_bytes > 0 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, budget.smem_per_sm) == cudaSuccess &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared) ==
          cudaSuccess &&
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&by_regs, kernel, threads, 0) == cudaSuccess && by_regs > 0) {
    p.stages = std::clamp(budget.smem_per_sm / by_regs / stage_bytes, 2, budget.max_stages);
    p.smem = p.stages * stage_bytes;
    if (p.smem <= budget.smem_per_sm &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, p.smem) == cudaSuccess && per_sm > 0) {
      p.resident = static_cast<int64_t>(dev.sms) * per_sm;
      p.ok = true;
    }
  }
  cudaGetLastError();  // clear any failed query: the caller takes its other path
  return p;
}

void PreferMaxShared(const void* kernel) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared) !=
      cudaSuccess) {
    cudaGetLastError();
  }
}

}  // namespace ftd::kernels

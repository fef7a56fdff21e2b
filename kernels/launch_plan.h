// Launch planning shared by the kernel families (host code, no LibTorch): what a device is, how many
// blocks of a kernel it holds at once, and how deep a ring of shared-memory stages (bulk_ring.cuh)
// should be for a kernel to keep a multiprocessor's copy engine busy.
//
// Nothing here caches. The planners take the device's properties explicitly (DeviceProps, queried once
// by the caller) and return values; a family's plan (e.g. RmsNormPlan) is built from them once per
// device and shape, and the caller keeps it: the worker's adapter caches one per device and shape, a
// test or benchmark builds its own.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ftd::kernels {

// What the planners need to know of one device.
struct DeviceProps {
  int device = 0;    // CUDA ordinal
  int sms = 1;       // multiprocessors
  int cc_major = 0;  // compute capability, major
  // sm_90 and newer: bulk copies completing on mbarriers (bulk_ring.cuh) and programmatic dependent
  // launches (LaunchPdl in common.cuh).
  bool HasBulkCopy() const { return cc_major >= 9; }
};

// Queries `device`'s properties (two attribute queries; callers keep the result).
cudaError_t QueryDeviceProps(int device, DeviceProps* props);

// The current device's properties.
cudaError_t CurrentDeviceProps(DeviceProps* props);

// Blocks of `kernel` with `threads` threads and `smem` bytes of dynamic shared memory resident at once
// on the device (multiprocessors x blocks per multiprocessor); at least 1 (also when the query fails).
// The device must be current.
int64_t ResidentBlocks(const DeviceProps& dev, const void* kernel, int threads, size_t smem = 0);

// Row groups for a persistent pass over `rows` rows with at most `cap` groups at once: as many as
// possible, then as few as give the same number of rows to the busiest group (balances the tail).
int64_t BalancedGroups(int64_t rows, int64_t cap);

// A ring kernel's shared-memory budget: the stage bytes one multiprocessor should have in flight
// (spread over the blocks its registers and threads allow), and the most stages a block has.
struct RingBudget {
  int smem_per_sm = 0;  // bytes
  int max_stages = 0;
};

// How a ring kernel launches: `stages` stages of `stage_bytes` (smem = their product, dynamic shared
// memory per block) and the blocks resident at once with that much shared memory. !ok: the device has
// no bulk copy engine or a query failed; take the family's other path.
struct RingPlan {
  bool ok = false;
  int stages = 0;
  int stage_bytes = 0;
  int smem = 0;
  int64_t resident = 0;
};

// Plans `kernel` (a ring kernel run with `threads` threads) for stages of `stage_bytes`: as many stages
// as give the multiprocessor about budget.smem_per_sm bytes in flight over the blocks its registers and
// threads allow (2..budget.max_stages). Also sets the kernel's attributes on the device (the largest
// dynamic shared memory the budget allows, the largest shared-memory carveout), so the device must be
// current, and the plan is valid on that device only.
RingPlan PlanRing(const DeviceProps& dev, const void* kernel, int threads, int stage_bytes, RingBudget budget);

// Asks for the largest shared-memory carveout for `kernel` on the current device: a hint (failures are
// ignored) that spares the multiprocessors a reconfiguration between it and a ring kernel.
void PreferMaxShared(const void* kernel);

}  // namespace ftd::kernels

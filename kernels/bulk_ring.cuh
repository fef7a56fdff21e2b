// A ring of shared-memory stages that the bulk copy engine fills with rows ahead of the threads that
// compute on them (sm_90 and newer). Included by .cu files only; the host side (how many stages, how
// much shared memory) is PlanRing in launch_plan.h.
//
// Each stage holds one row of each of kTensors tensors (rows of n elements of T, contiguous, 16-byte
// aligned), each in a slot of RingSlotBytes(row bytes). A block visits its rows first, first + step,
// ... (count of them); its j-th row is in stage j % stages, which is filled by one bulk copy per tensor
// that completes on the stage's mbarrier (phase j / stages), so the bytes in flight depend neither on
// registers nor on the warps being busy elsewhere. Use, by every thread of the block:
//
//   __shared__ __align__(8) uint64_t bars[kMaxStages];      // the stages' barriers
//   extern __shared__ __align__(128) unsigned char mem[];   // stages * kTensors slots
//   RowRing<T, kTensors> ring(mem, bars, stages, n, {src0, ...});
//   GridDependencyWait();
//   if (threadIdx.x == 0) ring.Start(first, step, count);  // up to `stages` rows in flight
//   __syncthreads();                                        // the barriers are initialised
//   for (j = 0; j < count; ++j) {
//     ring.Wait();                                          // this row's stage has landed
//     ... read ring.Row(t) into registers, then a __syncthreads() (e.g. inside a block reduction) ...
//     if (threadIdx.x == 0 && j + stages < count) ring.Refill(row + stages * step);
//     ... compute from registers ...
//     ring.Next();
//   }
//
// The refill needs the barrier between every thread's last read of the stage and thread 0's refill:
// the copy engine overwrites the stage asynchronously.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ftd::kernels::detail {

// Bytes each row's slot in a stage starts aligned to (and its size is rounded up to).
inline constexpr int kRingSlotAlign = 128;

// Bytes of one row's slot in a stage.
__host__ __device__ __forceinline__ uint32_t RingSlotBytes(uint32_t row_bytes) {
  return (row_bytes + kRingSlotAlign - 1) / kRingSlotAlign * kRingSlotAlign;
}

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Orders the mbarrier inits before the bulk copies that complete on them.
__device__ __forceinline__ void FenceMbarInit() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// Arrives (the barrier's one expected arrival) and adds `bytes` to the transaction count of this phase.
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory through
// the bulk copy engine; completes `bytes` transactions on `bar`.
__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// Waits until the phase of `bar` with the given parity has completed.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

template <typename T, int kTensors>
class RowRing {
 public:
  __device__ __forceinline__ RowRing(unsigned char* mem, uint64_t* bars, int stages, int n,
                                     const T* const (&src)[kTensors])
      : mem_(mem),
        mem0_(SmemAddr(mem)),
        bar0_(SmemAddr(bars)),
        row_bytes_(static_cast<uint32_t>(n) * sizeof(T)),
        slot_(RingSlotBytes(row_bytes_)),
        stride_(kTensors * slot_),
        stages_(stages),
        n_(n) {
#pragma unroll
    for (int t = 0; t < kTensors; ++t) src_[t] = src[t];
  }

  // Thread 0, once: initialises the barriers and fills stage s with row first + s * step, for s < stages
  // and s < count.
  __device__ __forceinline__ void Start(int64_t first, int64_t step, int64_t count) {
    for (int s = 0; s < stages_; ++s) MbarInit(bar0_ + 8 * s, 1);
    FenceMbarInit();
    for (int s = 0; s < stages_ && s < count; ++s) Fill(s, first + s * step);
  }
  // Waits until the current stage holds its rows.
  __device__ __forceinline__ void Wait() const { MbarWait(bar0_ + 8 * s_, parity_); }
  // Tensor t's row in the current stage.
  __device__ __forceinline__ const T* Row(int t) const {
    return reinterpret_cast<const T*>(mem_ + s_ * stride_ + t * slot_);
  }
  // Thread 0, once every thread has read the current stage: fills it with `row`.
  __device__ __forceinline__ void Refill(int64_t row) { Fill(s_, row); }
  // On to the next stage.
  __device__ __forceinline__ void Next() {
    if (++s_ == stages_) {
      s_ = 0;
      parity_ ^= 1u;
    }
  }

 private:
  __device__ __forceinline__ void Fill(int s, int64_t row) {
    const int64_t off = row * n_;
    MbarArriveExpectTx(bar0_ + 8 * s, kTensors * row_bytes_);
#pragma unroll
    for (int t = 0; t < kTensors; ++t) BulkLoad(mem0_ + s * stride_ + t * slot_, src_[t] + off, row_bytes_, bar0_ + 8 * s);
  }

  unsigned char* mem_;
  uint32_t mem0_, bar0_;
  uint32_t row_bytes_, slot_, stride_;
  int stages_;
  int n_;
  const T* src_[kTensors];
  int s_ = 0;
  uint32_t parity_ = 0;
};
#endif

}  // namespace ftd::kernels::detail

// The benchmark's shared measurements: median time of a callable from CUDA events on the current
// stream, the caching allocator's peak above a starting point, and the device-to-device copy
// bandwidth every row's "% of copy bandwidth" is measured against.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <vector>

#include "bench/kernels/bench.h"

namespace ftd::bench {
namespace {

void Ok(cudaError_t e, const char* what) { TORCH_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e)); }

class Event {
 public:
  Event() { Ok(cudaEventCreate(&e_), "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

int64_t AllocatedNow(c10::DeviceIndex device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
}

}  // namespace

double TimeUs(const std::function<void()>& f, const BenchConfig& cfg) {
  for (int i = 0; i < cfg.warmup; ++i) f();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  Event start, stop;
  std::vector<double> us;
  const int iters = std::max(1, cfg.iters);
  us.reserve(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    Ok(cudaEventRecord(start.get(), stream), "cudaEventRecord");
    f();
    Ok(cudaEventRecord(stop.get(), stream), "cudaEventRecord");
    Ok(cudaEventSynchronize(stop.get()), "cudaEventSynchronize");
    float ms = 0;
    Ok(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime");
    us.push_back(1e3 * static_cast<double>(ms));
  }
  std::sort(us.begin(), us.end());
  const size_t n = us.size();
  return n % 2 == 1 ? us[n / 2] : 0.5 * (us[n / 2 - 1] + us[n / 2]);
}

int64_t PeakBytes(const std::function<void()>& f) {
  const c10::DeviceIndex device = c10::cuda::current_device();
  Ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const int64_t before = AllocatedNow(device);
  c10::cuda::CUDACachingAllocator::resetPeakStats(device);
  f();
  Ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  const int64_t peak = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  return std::max<int64_t>(0, peak - before);
}

// Device-to-device copy of 1 GiB (well beyond the L2), counting bytes read plus bytes written, the
// ceiling every memory-bound row is compared with. Declared in bench_main.cc.
double MeasureCopyBytesPerSecond(const BenchConfig& cfg) {
  const int64_t bytes = int64_t{1} << 30;
  const auto opts = torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA);
  const auto src = torch::full({bytes}, 7, opts);
  auto dst = torch::empty({bytes}, opts);
  const double us = TimeUs([&] { dst.copy_(src); }, cfg);
  return 2.0 * static_cast<double>(bytes) / (us * 1e-6);
}

}  // namespace ftd::bench

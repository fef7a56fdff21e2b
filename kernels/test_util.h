// Host-side helpers for the kernel tests and benchmarks: device buffers, fresh random inputs,
// poisoning (every output is filled with NaN before a launch, so an element the kernel fails to
// write fails the comparison), dtype conversion and the error measure the tests use.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/common.h"
#include "kernels/launch_plan.h"

namespace ftd::kernels::testing {

inline void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

inline uint16_t FloatToBf16(float f) {  // round to nearest even, NaN kept NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float Bf16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// The value a double takes once stored in `t` (what the kernel actually sees as input).
inline double Quantize(double v, DType t) {
  return t == DType::kF32 ? static_cast<double>(static_cast<float>(v)) : Bf16ToFloat(FloatToBf16(static_cast<float>(v)));
}

// Every value of `v` as stored in `t`.
inline std::vector<double> Quantized(std::vector<double> v, DType t) {
  for (auto& x : v) x = Quantize(x, t);
  return v;
}

// A device allocation of n elements of `dtype` (or raw bytes), freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t n, DType t) : n_(n), dtype_(t) { Check(cudaMalloc(&p_, std::max<size_t>(1, n * DTypeSize(t))), "cudaMalloc"); }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(dtype_, o.dtype_);
    return *this;
  }
  void* get() const { return p_; }
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }
  size_t size() const { return n_; }
  DType dtype() const { return dtype_; }

  // Host doubles -> device, converted to the buffer's dtype.
  void Upload(const std::vector<double>& h) {
    if (h.size() != n_) throw std::runtime_error("Upload: size mismatch");
    if (dtype_ == DType::kF32) {
      std::vector<float> f(h.begin(), h.end());
      Check(cudaMemcpy(p_, f.data(), n_ * 4, cudaMemcpyHostToDevice), "upload");
    } else {
      std::vector<uint16_t> b(n_);
      for (size_t i = 0; i < n_; ++i) b[i] = FloatToBf16(static_cast<float>(h[i]));
      Check(cudaMemcpy(p_, b.data(), n_ * 2, cudaMemcpyHostToDevice), "upload");
    }
  }
  std::vector<double> Download() const {
    std::vector<double> out(n_);
    if (dtype_ == DType::kF32) {
      std::vector<float> f(n_);
      Check(cudaMemcpy(f.data(), p_, n_ * 4, cudaMemcpyDeviceToHost), "download");
      for (size_t i = 0; i < n_; ++i) out[i] = f[i];
    } else {
      std::vector<uint16_t> b(n_);
      Check(cudaMemcpy(b.data(), p_, n_ * 2, cudaMemcpyDeviceToHost), "download");
      for (size_t i = 0; i < n_; ++i) out[i] = Bf16ToFloat(b[i]);
    }
    return out;
  }
  // Fills every byte with 0xFF: NaN in fp32 and bf16.
  void Poison() { Check(cudaMemset(p_, 0xFF, std::max<size_t>(1, n_ * DTypeSize(dtype_))), "poison"); }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
  DType dtype_ = DType::kF32;
};

// Labels (int64) on the device, in a buffer of 8 bytes a label.
inline DeviceBuffer UploadLabels(const std::vector<int64_t>& labels) {
  DeviceBuffer d(labels.size() * 2, DType::kF32);
  Check(cudaMemcpy(d.get(), labels.data(), labels.size() * sizeof(int64_t), cudaMemcpyHostToDevice), "labels");
  return d;
}

// The current device's properties, for the launch planners.
inline DeviceProps CurrentProps() {
  DeviceProps p;
  Check(CurrentDeviceProps(&p), "CurrentDeviceProps");
  return p;
}

// Fresh random inputs each run (seeded from std::random_device; the seed is printed on failure by
// the caller through SeedNote()).
inline uint64_t& TestSeed() {
  static uint64_t seed = std::random_device{}();
  return seed;
}
inline std::string SeedNote() { return " (seed " + std::to_string(TestSeed()) + ")"; }

inline std::vector<double> RandomNormal(size_t n, double mean, double stddev, std::mt19937_64& rng) {
  std::normal_distribution<double> d(mean, stddev);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// max over i of |got[i] - want[i]| / |want[i]|: for per-row values (such as RMSNorm's rstd) whose rows
// differ in scale by orders of magnitude. NaN or a size mismatch gives +inf.
inline double MaxElementRelError(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double e = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    e = std::max(e, want[i] == 0 ? std::fabs(got[i]) : std::fabs(got[i] - want[i]) / std::fabs(want[i]));
  }
  return e;
}

// max |got - want| / max |want| over the tensor (the project's "max relative error"); NaN or a
// size mismatch gives +inf.
inline double MaxRelError(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num = std::max(num, std::fabs(got[i] - want[i]));
    den = std::max(den, std::fabs(want[i]));
  }
  return den == 0 ? num : num / den;
}

// A device tensor of n elements starting `offset` elements into its allocation (offset 1: unaligned).
class Tensor {
 public:
  Tensor(size_t n, DType t, size_t offset = 0) : buf_(n + offset, t), off_(offset) {}
  void* get() const { return static_cast<char*>(buf_.get()) + off_ * DTypeSize(buf_.dtype()); }
  void Upload(const std::vector<double>& v) {
    std::vector<double> padded(off_, 0.0);
    padded.insert(padded.end(), v.begin(), v.end());
    buf_.Upload(padded);
  }
  std::vector<double> Download() const {
    auto all = buf_.Download();
    return std::vector<double>(all.begin() + static_cast<std::ptrdiff_t>(off_), all.end());
  }
  void Poison() { buf_.Poison(); }

 private:
  DeviceBuffer buf_;
  size_t off_;
};

// The tolerance of an output stored in `t`: fp32 ~1e-5 relative to the tensor's largest value, bf16
// its own rounding (2^-8).
inline double Tol(DType t) { return t == DType::kF32 ? 1e-5 : std::ldexp(1.0, -8); }

// True when a CUDA device is visible (GPU tests skip with a message otherwise).
inline bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace ftd::kernels::testing

// The kernel benchmark (bench/kernels): each family times its fused launcher against the eager
// LibTorch ops the `eager` kernel set runs (the same math HF transformers runs), forward+backward,
// on the LLaMA-3.1-8B sizes, and reports time, achieved bandwidth against the device-to-device copy
// bandwidth measured in the same run, peak memory and speedup. Both sides allocate through
// LibTorch's caching allocator so their peak memory is measured the same way.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ftd::bench {

struct BenchConfig {
  std::vector<int64_t> tokens = {256, 1024, 4096, 16384};
  int64_t hidden = 4096;
  int64_t intermediate = 14336;
  int64_t vocab = 128256;
  int64_t heads = 32, kv_heads = 8, head_dim = 128;
  int warmup = 3;
  int iters = 20;
  torch::ScalarType dtype = torch::kBFloat16;
  double copy_bytes_per_s = 0;  // measured device-to-device copy (bytes read + written per second)
};

struct Row {
  std::string family;   // "rmsnorm", "cross_entropy", ...
  std::string variant;  // e.g. "fwd+bwd", "step"
  int64_t tokens = 0;
  double ours_us = 0, eager_us = 0;  // median over iters
  double bytes = 0;                  // minimum bytes the fused version must move (read + write)
  int64_t ours_peak_bytes = 0, eager_peak_bytes = 0;  // allocator peak above the inputs
  std::string note;
};

// Median wall time of `f` in microseconds, from CUDA events on the current stream, after warm-up.
double TimeUs(const std::function<void()>& f, const BenchConfig& cfg);
// Peak bytes the caching allocator held above what was allocated before one call of `f`.
int64_t PeakBytes(const std::function<void()>& f);

// One function per family; each appends its rows.
void BenchRmsNorm(const BenchConfig& cfg, std::vector<Row>& rows);
void BenchSwiGlu(const BenchConfig& cfg, std::vector<Row>& rows);
void BenchRope(const BenchConfig& cfg, std::vector<Row>& rows);
void BenchAdamW(const BenchConfig& cfg, std::vector<Row>& rows);
void BenchCrossEntropy(const BenchConfig& cfg, std::vector<Row>& rows);
void BenchFusedLinearCrossEntropy(const BenchConfig& cfg, std::vector<Row>& rows);
void BenchFp8Cast(const BenchConfig& cfg, std::vector<Row>& rows);
void BenchFp8Tiles(const BenchConfig& cfg, std::vector<Row>& rows);

}  // namespace ftd::bench

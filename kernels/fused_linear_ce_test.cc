// GPU test of the production fused linear cross-entropy launcher against the float64 chunked
// reference, on fresh random inputs, with a real cuBLAS handle on a non-default stream.
//
// The reference reads the quantized x and W (what the kernel reads) and applies the workspace's
// storage rounding to the chunk logits and to dlogits, as the kernel does (store = Quantize(., dtype)).
//
// Tolerances (max |got - want| / max |want| over a tensor):
//   fp32 (x, W ~ normal): loss, lse, dweight 1e-5; dx 2e-5 (each dx element is an fp32 sum over vocab
//     = 8003 products, the longest reduction here; fp32 GEMM error grows ~sqrt(K) * 2^-24).
//   bf16: x and W are drawn on a coarse grid (x = i/4, W = k/16, small integers i, k), so every
//     product and every sum of the first GEMM is exact in fp32 and the bf16 logits equal the
//     reference's rounded logits bit for bit. Then:
//     loss, lse: 1e-5 (fp32 cross-entropy arithmetic on identical inputs, ~1e-6).
//     dx: 2 * 2^-8 + 1e-4. dx is rounded to bf16 (2^-8 of each value); dlogits are computed in fp32
//       (~1e-6 relative) and rounded to bf16, and where that lands on the other side of a rounding
//       boundary than float64 does, one element differs by one bf16 ulp; for the label entry
//       (|dlogit| in [0.5, 1), ulp 2^-8) that moves dx by up to 2^-8 |W[label]| (~ max |dx|); the
//       other, tiny entries add up to ~1e-4 at most.
//     dweight: (chunks + 1) * 2^-8 + 1e-4. dweight accumulates across chunks in bf16: one rounding of
//       the running sum per chunk, plus the label-entry boundary case above.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/fused_linear_ce.h"
#include "kernels/fused_linear_ce_ref.h"
#include "kernels/test_util.h"

namespace ftd::kernels {
namespace {

using namespace testing;  // kernels/test_util.h

constexpr int64_t kIgnore = -100;

struct FlceCase {
  std::string name;
  int64_t rows, hidden, vocab, chunk_rows;
  bool accumulate_dweight = false;
  bool use_grad_scale = true;  // false: grad_scale == nullptr (s = 1)
  bool dx_aliases_x = false;
  bool invalid_label = false;
  bool frozen_weight = false;  // dweight nullptr: no weight gradient (the poisoned buffer stays as it was)
};

class CublasHandle {
 public:
  CublasHandle() {
    if (cublasCreate(&h_) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate");
  }
  ~CublasHandle() { cublasDestroy(h_); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

class Stream {
 public:
  Stream() { Check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "stream"); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// fp32: normal values. bf16: values on a grid, small integer / 2^p, so the first GEMM is exact.
std::vector<double> MakeInput(size_t n, DType dtype, double stddev, double grid, int max_int, std::mt19937_64& rng) {
  std::vector<double> v(n);
  if (dtype == DType::kF32) {
    std::normal_distribution<double> normal(0, stddev);
    for (auto& e : v) e = normal(rng);
  } else {
    std::uniform_int_distribution<int> pick(-max_int, max_int);
    for (auto& e : v) e = pick(rng) * grid;
  }
  return v;
}

void RunCase(const FlceCase& c, DType dtype) {
  SCOPED_TRACE(c.name + " " + DTypeName(dtype) + " rows " + std::to_string(c.rows) + " hidden " +
               std::to_string(c.hidden) + " vocab " + std::to_string(c.vocab) + " chunk " +
               std::to_string(c.chunk_rows) + SeedNote());
  std::mt19937_64 rng(TestSeed() ^ std::hash<std::string>{}(c.name + DTypeName(dtype)));
  const size_t nx = static_cast<size_t>(c.rows * c.hidden), nw = static_cast<size_t>(c.vocab * c.hidden);

  // Inputs: logits ~ N(0, ~2) in both modes.
  DeviceBuffer x(nx, dtype), w(nw, dtype);
  x.Upload(MakeInput(nx, dtype, 1.0, 0.25, 4, rng));
  w.Upload(MakeInput(nw, dtype, 2.0 / std::sqrt(static_cast<double>(c.hidden)), 1.0 / 16, 6, rng));
  const std::vector<double> xq = x.Download(), wq = w.Download();

  std::uniform_int_distribution<int64_t> pick(0, c.vocab - 1);
  std::uniform_real_distribution<double> unit(0, 1);
  std::vector<int64_t> labels(static_cast<size_t>(c.rows));
  int64_t count = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    labels[r] = (r > 0 && unit(rng) < 0.15) ? kIgnore : pick(rng);
    count += labels[r] != kIgnore;
  }
  if (c.invalid_label) labels[static_cast<size_t>(c.rows / 2)] = c.vocab + 3;
  const DeviceBuffer labels_d = UploadLabels(labels);

  // A mean over the non-ignored rows: s = 1 / count.
  const double s = c.use_grad_scale ? static_cast<double>(1.0f / static_cast<float>(count)) : 1.0;
  DeviceBuffer scale(1, DType::kF32);
  scale.Upload({s});

  // Outputs: poisoned, except an accumulated dweight, which starts from known values.
  DeviceBuffer loss(static_cast<size_t>(c.rows), DType::kF32), lse(static_cast<size_t>(c.rows), DType::kF32);
  DeviceBuffer dx_separate, dw(nw, dtype);
  loss.Poison();
  lse.Poison();
  std::vector<double> dw0(nw, 0.0);
  if (c.accumulate_dweight) {
    dw.Upload(MakeInput(nw, dtype, 0.01, 1.0 / 256, 8, rng));
    dw0 = dw.Download();
  } else {
    dw.Poison();
  }
  void* dx_ptr = x.get();
  if (!c.dx_aliases_x) {
    dx_separate = DeviceBuffer(nx, dtype);
    dx_separate.Poison();
    dx_ptr = dx_separate.get();
  }
  const size_t ws_bytes = FusedLinearCrossEntropyWorkspaceBytes(dtype, c.rows, c.hidden, c.vocab, c.chunk_rows);
  DeviceBuffer ws((ws_bytes + 3) / 4, DType::kF32);
  ws.Poison();

  CublasHandle handle;
  // Reductions (split-K) in fp32, not in the bf16 output type, so that the bounds above hold; the
  // launcher itself leaves the handle's math mode to the caller.
  ASSERT_EQ(cublasSetMathMode(handle.get(), static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                                       CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
            CUBLAS_STATUS_SUCCESS);
  Stream stream;
  ASSERT_EQ(FusedLinearCrossEntropy(handle.get(), dtype, x.get(), w.get(), labels_d.as<int64_t>(), loss.as<float>(),
                                    lse.as<float>(), dx_ptr, c.frozen_weight ? nullptr : dw.get(), c.accumulate_dweight,
                                    c.use_grad_scale ? scale.as<float>() : nullptr, ws.get(), ws_bytes, c.rows,
                                    c.hidden, c.vocab, c.chunk_rows, kIgnore, stream.get()),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);

  std::vector<double> want_loss(c.rows), want_lse(c.rows), want_dx(nx), want_dw = dw0;
  const std::function<double(double)> store = [dtype](double v) { return Quantize(v, dtype); };
  ref::FusedLinearCrossEntropy(xq, wq, labels, want_loss, want_lse, want_dx, want_dw, c.accumulate_dweight, s,
                               c.rows, c.hidden, c.vocab, c.chunk_rows, kIgnore, store);

  const std::vector<double> got_loss = loss.Download(), got_lse = lse.Download();
  const std::vector<double> got_dx = c.dx_aliases_x ? x.Download() : dx_separate.Download();
  std::vector<double> got_dw = dw.Download();
  if (c.frozen_weight) {
    // Nothing was written to the (poisoned) buffer; the weight gradient is not checked.
    for (size_t i = 0; i < got_dw.size(); ++i) ASSERT_TRUE(std::isnan(got_dw[i])) << "dweight written at " << i;
    got_dw = want_dw;
  }

  EXPECT_LE(MaxRelError(got_lse, want_lse), 1e-5) << "lse";
  if (c.invalid_label) {
    // A NaN row poisons the gradients through the GEMMs; the other rows' loss must still be right.
    const size_t bad = static_cast<size_t>(c.rows / 2);
    EXPECT_TRUE(std::isnan(got_loss[bad])) << "invalid label must give a NaN loss";
    std::vector<double> g = got_loss, want = want_loss;
    g.erase(g.begin() + static_cast<std::ptrdiff_t>(bad));
    want.erase(want.begin() + static_cast<std::ptrdiff_t>(bad));
    EXPECT_LE(MaxRelError(g, want), 1e-5) << "loss of the other rows";
    return;
  }
  for (int64_t r = 0; r < c.rows; ++r) {
    if (labels[r] == kIgnore) {
      EXPECT_EQ(got_loss[r], 0.0) << "ignored row " << r;
    }
  }
  EXPECT_LE(MaxRelError(got_loss, want_loss), 1e-5) << "loss";

  const int64_t chunks = (c.rows + c.chunk_rows - 1) / c.chunk_rows;
  const double u = std::ldexp(1.0, -8);
  const double tol_dx = dtype == DType::kF32 ? 2e-5 : 2 * u + 1e-4;
  const double tol_dw = dtype == DType::kF32 ? 1e-5 : static_cast<double>(chunks + 1) * u + 1e-4;
  EXPECT_LE(MaxRelError(got_dx, want_dx), tol_dx) << "dx";
  EXPECT_LE(MaxRelError(got_dw, want_dw), tol_dw) << "dweight" << (c.accumulate_dweight ? " (accumulated)" : "");
  int64_t ignored_nonzero = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    if (labels[r] != kIgnore) continue;
    for (int64_t k = 0; k < c.hidden; ++k) ignored_nonzero += got_dx[r * c.hidden + k] != 0.0;
  }
  EXPECT_EQ(ignored_nonzero, 0) << "dx rows of ignored tokens must be exactly 0";
}

void RunBoth(const FlceCase& c) {
  RunCase(c, DType::kF32);
  RunCase(c, DType::kBF16);
}

// Several chunks plus a partial one (16, 16, 5), odd hidden and vocab.
TEST(FusedLinearCeGpu, OddSizesSeveralChunks) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  RunBoth({"odd", 37, 129, 8003, 16});
}

// Aligned sizes in one chunk, in two equal chunks, and a single row with the default chunk size.
TEST(FusedLinearCeGpu, AlignedSizes) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  RunBoth({"aligned-1chunk", 64, 256, 4096, 64});
  RunBoth({"aligned-2chunks", 64, 256, 4096, 32});
  RunBoth({"one-row", 1, 64, 1000, kFusedLinearCeDefaultChunkRows});
}

// dweight += onto existing values (gradient accumulation, tied embeddings).
TEST(FusedLinearCeGpu, AccumulatesDweight) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  FlceCase c{"accumulate", 37, 129, 8003, 16};
  c.accumulate_dweight = true;
  RunBoth(c);
}

// A frozen weight (LoRA's lm_head): dweight nullptr, nothing written there, dx and the loss as usual.
TEST(FusedLinearCeGpu, FrozenWeightGetsNoGradient) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  FlceCase c{"frozen", 37, 129, 8003, 16};
  c.frozen_weight = true;
  RunBoth(c);
}

// grad_scale == nullptr (s = 1), and dx written over x.
TEST(FusedLinearCeGpu, NoScaleAndInPlaceDx) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  FlceCase c{"no-scale", 37, 129, 8003, 16};
  c.use_grad_scale = false;
  RunBoth(c);
  c = {"dx-in-place", 37, 129, 8003, 16};
  c.dx_aliases_x = true;
  RunBoth(c);
}

TEST(FusedLinearCeGpu, InvalidLabelGivesNaNLoss) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  FlceCase c{"invalid", 37, 129, 8003, 16};
  c.invalid_label = true;
  RunBoth(c);
}

TEST(FusedLinearCeGpu, WorkspaceSizeAndArguments) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  // One chunk of logits, rows rounded up to whole 16-byte vectors.
  EXPECT_EQ(FusedLinearCrossEntropyWorkspaceBytes(DType::kBF16, 37, 129, 8003, 16), size_t{16} * 8008 * 2);
  EXPECT_EQ(FusedLinearCrossEntropyWorkspaceBytes(DType::kF32, 37, 129, 8003, 16), size_t{16} * 8004 * 4);
  EXPECT_EQ(FusedLinearCrossEntropyWorkspaceBytes(DType::kBF16, 5, 4096, 128256, 2048), size_t{5} * 128256 * 2);
  EXPECT_EQ(FusedLinearCrossEntropyWorkspaceBytes(DType::kBF16, 16384, 4096, 128256, 2048),
            size_t{16384} * 128256 * 2 / 8)
      << "the default chunk is 1/8 of the materialised logits at 16384 rows";
  EXPECT_EQ(FusedLinearCrossEntropyWorkspaceBytes(DType::kBF16, 0, 4096, 128256, 2048), 0u);
  EXPECT_EQ(FusedLinearCrossEntropyWorkspaceBytes(DType::kBF16, 4, 4096, 128256, 0), 0u);

  const int64_t rows = 4, hidden = 8, vocab = 16, chunk = 2;
  DeviceBuffer x(rows * hidden, DType::kF32), w(vocab * hidden, DType::kF32), dx(rows * hidden, DType::kF32);
  DeviceBuffer dw(vocab * hidden, DType::kF32), labels(rows * 2, DType::kF32), f(rows, DType::kF32);
  const size_t need = FusedLinearCrossEntropyWorkspaceBytes(DType::kF32, rows, hidden, vocab, chunk);
  DeviceBuffer ws(need / 4 + 4, DType::kF32);
  CublasHandle handle;
  auto call = [&](void* workspace, size_t bytes, int64_t n, bool accumulate) {
    return FusedLinearCrossEntropy(handle.get(), DType::kF32, x.get(), w.get(), labels.as<int64_t>(), f.as<float>(),
                                   f.as<float>(), dx.get(), dw.get(), accumulate, nullptr, workspace, bytes, n, hidden,
                                   vocab, chunk, kIgnore, nullptr);
  };
  EXPECT_EQ(call(ws.get(), need - 1, rows, false), cudaErrorInvalidValue) << "workspace too small";
  EXPECT_EQ(call(ws.as<char>() + 4, need, rows, false), cudaErrorInvalidValue) << "workspace not 16-byte aligned";
  EXPECT_EQ(call(nullptr, 0, rows, false), cudaErrorInvalidValue) << "no workspace";

  // No rows: dweight is zeroed, or left alone when accumulating.
  dw.Poison();
  ASSERT_EQ(call(nullptr, 0, 0, false), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (double v : dw.Download()) ASSERT_EQ(v, 0.0) << "rows 0 zeroes dweight";
  std::vector<double> ones(static_cast<size_t>(vocab * hidden), 1.0);
  dw.Upload(ones);
  ASSERT_EQ(call(nullptr, 0, 0, true), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(dw.Download(), ones) << "rows 0 with accumulate leaves dweight alone";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace ftd::kernels

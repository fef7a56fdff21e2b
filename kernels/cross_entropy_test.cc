// GPU test of the production cross-entropy launchers against the float64 reference applied to the
// values the kernel actually read (inputs quantized to the storage dtype), on fresh random inputs.
//
// Tolerances (max |got - want| / max |want| over a tensor):
//   loss, lse (fp32 outputs, both dtypes): 1e-5. The inputs are exact, so only fp32 arithmetic
//     differs: ex2.approx (~2^-22 relative) and fp32 sums over <= 128256 terms give ~1e-6.
//   dlogits fp32: 1e-5, the same arithmetic error carried through exp(x - lse).
//   dlogits bf16: 2^-8 + 1e-5: round-to-nearest into bf16 (8 significant bits) is within 2^-8 of each
//     value, plus the fp32 arithmetic above.
// Every output buffer is poisoned (NaN) before each launch, so an element the kernel fails to write
// fails the comparison; padding columns and the bytes before the first row must keep their poison
// (or, in place, the original logits), which catches writes out of bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/cross_entropy.h"
#include "kernels/cross_entropy_ref.h"
#include "kernels/test_util.h"

namespace ftd::kernels {
namespace {

using namespace testing;  // kernels/test_util.h

constexpr int64_t kIgnore = -100;

enum class GradMode { kScalar, kPerRow, kNone };  // grad_stride 0, grad_stride 1, grad_loss == nullptr

struct CeCase {
  std::string name;
  int64_t rows, vocab, ld, ld_out;
  int64_t in_offset = 0, out_offset = 0;  // elements before the first row: misaligns the base pointer
  bool in_place = false;                  // dlogits == logits (then ld_out must equal ld)
  GradMode grad = GradMode::kPerRow;
  bool invalid_labels = false;            // a label == vocab and a label == -7 (neither ignored)
  double ignore_frac = 0.15;
};

std::string Describe(const CeCase& c, DType t) {
  return c.name + " " + DTypeName(t) + " rows " + std::to_string(c.rows) + " vocab " + std::to_string(c.vocab) +
         " ld " + std::to_string(c.ld) + " ld_out " + std::to_string(c.ld_out) + SeedNote();
}

// Columns [1, MaskEnd) of every fifth row are -inf (a masked vocabulary): long enough that whole
// batches of a thread are -inf before it sees a finite value. Column 0 and [MaskEnd, vocab) stay finite.
bool MaskedRow(int64_t r) { return r % 5 == 4; }
int64_t MaskEnd(int64_t vocab) { return vocab * 7 / 8; }

// Logits with rows that stress the online max: random, an ascending ramp (new max nearly every
// vector), a +200 offset (exp overflows fp32 without the max shift), wide random values, and
// masked rows with long runs of -inf.
std::vector<double> MakeLogits(size_t n, int64_t offset, int64_t ld, int64_t vocab, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0, 2);
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t k = static_cast<int64_t>(i) - offset;
    const int64_t r = k >= 0 ? k / ld : 0, j = k >= 0 ? k % ld : 0;
    double v = normal(rng);
    switch (r % 5) {
      case 1: v = -8.0 + 16.0 * static_cast<double>(j) / static_cast<double>(vocab) + 0.05 * v; break;
      case 2: v += 200.0; break;
      case 3: v *= 2.5; break;
      default: break;
    }
    if (k >= 0 && MaskedRow(r) && j >= 1 && j < MaskEnd(vocab)) v = -INFINITY;
    x[i] = v;
  }
  return x;
}

void RunCase(const CeCase& c, DType dtype) {
  SCOPED_TRACE(Describe(c, dtype));
  std::mt19937_64 rng(TestSeed() ^ std::hash<std::string>{}(c.name + DTypeName(dtype)));
  const size_t es = DTypeSize(dtype);

  // Inputs.
  const size_t n_in = static_cast<size_t>(c.in_offset + c.rows * c.ld);
  DeviceBuffer logits(n_in, dtype);
  logits.Upload(MakeLogits(n_in, c.in_offset, c.ld, c.vocab, rng));
  const std::vector<double> xq = logits.Download();  // exactly what the kernel reads
  const std::span<const double> xrows = std::span<const double>(xq).subspan(static_cast<size_t>(c.in_offset));

  std::uniform_int_distribution<int64_t> pick(0, c.vocab - 1);
  std::uniform_real_distribution<double> unit(0, 1);
  std::vector<int64_t> labels(static_cast<size_t>(c.rows));
  for (int64_t r = 0; r < c.rows; ++r) {
    labels[r] = (r > 0 && unit(rng) < c.ignore_frac) ? kIgnore : pick(rng);
    // A masked row's label must be on a finite logit (else the loss is +inf).
    if (MaskedRow(r) && labels[r] >= 1 && labels[r] < MaskEnd(c.vocab)) labels[r] = (r / 5) % 2 == 0 ? 0 : c.vocab - 1;
  }
  if (c.invalid_labels) {
    labels[static_cast<size_t>(c.rows / 2)] = c.vocab;
    labels[static_cast<size_t>(c.rows - 1)] = -7;
  }
  const DeviceBuffer labels_d = UploadLabels(labels);
  auto ignored = [&](int64_t r) { return labels[r] == kIgnore; };
  auto invalid = [&](int64_t r) { return !ignored(r) && (labels[r] < 0 || labels[r] >= c.vocab); };

  // Forward.
  DeviceBuffer loss(static_cast<size_t>(c.rows), DType::kF32), lse(static_cast<size_t>(c.rows), DType::kF32);
  loss.Poison();
  lse.Poison();
  ASSERT_EQ(CrossEntropyForward(dtype, static_cast<const char*>(logits.get()) + c.in_offset * es, c.ld,
                                labels_d.as<int64_t>(), loss.as<float>(), lse.as<float>(), c.rows, c.vocab, kIgnore,
                                nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<double> want_loss(c.rows), want_lse(c.rows);
  ref::CrossEntropyForward(xrows, c.ld, labels, want_loss, want_lse, c.rows, c.vocab, kIgnore);
  const std::vector<double> got_loss = loss.Download(), got_lse = lse.Download();

  EXPECT_LE(MaxRelError(got_lse, want_lse), 1e-5) << "lse, every row (ignored ones too)";
  std::vector<double> got_valid, want_valid;
  for (int64_t r = 0; r < c.rows; ++r) {
    if (ignored(r)) {
      EXPECT_EQ(got_loss[r], 0.0) << "ignored row " << r;
    } else if (invalid(r)) {
      EXPECT_TRUE(std::isnan(got_loss[r])) << "invalid label row " << r << " got " << got_loss[r];
    } else {
      got_valid.push_back(got_loss[r]);
      want_valid.push_back(want_loss[r]);
    }
  }
  EXPECT_LE(MaxRelError(got_valid, want_valid), 1e-5) << "loss";

  // Backward.
  std::vector<double> grad;
  int64_t grad_stride = 0;
  switch (c.grad) {
    case GradMode::kScalar: grad = {static_cast<double>(0.731f)}; break;
    case GradMode::kPerRow:
      grad.resize(static_cast<size_t>(c.rows));
      for (auto& g : grad) g = static_cast<float>(4 * unit(rng) - 2);  // the fp32 value the kernel reads
      grad_stride = 1;
      break;
    case GradMode::kNone: break;
  }
  DeviceBuffer grad_d(std::max<size_t>(1, grad.size()), DType::kF32);
  if (!grad.empty()) grad_d.Upload(grad);

  DeviceBuffer out_separate;
  const DeviceBuffer* out = &logits;
  int64_t out_offset = c.in_offset, ld_out = c.ld;
  if (!c.in_place) {
    out_separate = DeviceBuffer(static_cast<size_t>(c.out_offset + c.rows * c.ld_out), dtype);
    out_separate.Poison();
    out = &out_separate;
    out_offset = c.out_offset;
    ld_out = c.ld_out;
  }
  ASSERT_EQ(CrossEntropyBackward(dtype, static_cast<const char*>(logits.get()) + c.in_offset * es, c.ld,
                                 labels_d.as<int64_t>(), lse.as<float>(),
                                 c.grad == GradMode::kNone ? nullptr : grad_d.as<float>(), grad_stride,
                                 static_cast<char*>(out->get()) + out_offset * es, ld_out, c.rows, c.vocab, kIgnore,
                                 nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<double> want_d(static_cast<size_t>(c.rows * ld_out), 0.0);
  ref::CrossEntropyBackward(xrows, c.ld, labels, want_lse, grad, grad_stride, want_d, ld_out, c.rows, c.vocab,
                            kIgnore);
  const std::vector<double> got_all = out->Download();
  const std::span<const double> got_d = std::span<const double>(got_all).subspan(static_cast<size_t>(out_offset));

  got_valid.clear();
  want_valid.clear();
  int64_t bad_ignored = 0, bad_invalid = 0, bad_padding = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t j = 0; j < ld_out; ++j) {
      const double got = got_d[r * ld_out + j];
      if (j >= c.vocab) {  // padding: never written
        const bool kept = c.in_place ? got == xrows[r * c.ld + j] : std::isnan(got);
        bad_padding += kept ? 0 : 1;
      } else if (ignored(r)) {
        bad_ignored += got == 0.0 ? 0 : 1;
      } else if (invalid(r)) {
        bad_invalid += std::isnan(got) ? 0 : 1;
      } else {
        got_valid.push_back(got);
        want_valid.push_back(want_d[r * ld_out + j]);
      }
    }
  }
  for (int64_t i = 0; i < out_offset; ++i) {
    const bool kept = c.in_place ? got_all[i] == xq[i] : std::isnan(got_all[i]);
    bad_padding += kept ? 0 : 1;
  }
  const double tol = dtype == DType::kF32 ? 1e-5 : std::ldexp(1.0, -8) + 1e-5;
  EXPECT_LE(MaxRelError(got_valid, want_valid), tol) << "dlogits";
  EXPECT_EQ(bad_ignored, 0) << "ignored rows must be exactly 0";
  EXPECT_EQ(bad_invalid, 0) << "rows with an invalid label must be NaN";
  EXPECT_EQ(bad_padding, 0) << "elements outside [rows, vocab) must be untouched";
}

void RunBoth(const CeCase& c) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  RunCase(c, DType::kF32);
  RunCase(c, DType::kBF16);
}

// Contiguous odd vocabulary: rows start at every 16-byte offset, so each row has a scalar head, a
// vector body and a scalar tail (256-thread blocks).
TEST(CrossEntropyGpu, OddVocabContiguous) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (int64_t rows : {1, 3, 37, 257}) RunBoth({"odd", rows, 8003, 8003, 8003});
}

// Aligned rows: vector body only (256-thread blocks), and the full LLaMA-3 vocabulary (512 threads).
TEST(CrossEntropyGpu, AlignedVocab) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  RunBoth({"aligned", 64, 4096, 4096, 4096});
  RunBoth({"llama3", 5, 128256, 128256, 128256});
}

// Small vocabularies (128-thread blocks; bf16 vocab 7 has no vector body at all; vocab 1 has loss 0
// and gradient 0 for every valid row).
TEST(CrossEntropyGpu, SmallVocab) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  RunBoth({"vocab7", 37, 7, 7, 7});
  RunBoth({"vocab1", 5, 1, 1, 1});
  RunBoth({"vocab1000", 37, 1000, 1000, 1000});
}

// Padded strides that differ between logits and dlogits: in some rows the two share their 16-byte
// offset (vector path), in others not (scalar path). Padding columns must stay untouched.
TEST(CrossEntropyGpu, PaddedStridesMixedPaths) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  RunBoth({"padded", 37, 1000, 1003, 1010});
}

// dlogits based one element off 16 bytes while logits are aligned: every row takes the scalar path.
TEST(CrossEntropyGpu, ScalarPathMisalignedOutput) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  RunBoth({"scalar", 37, 4096, 4096, 4096, /*in_offset=*/0, /*out_offset=*/1});
  RunBoth({"scalar-odd", 3, 8003, 8003, 8003, /*in_offset=*/3, /*out_offset=*/0});
}

// Misaligned logits base (row 0 starts off a 16-byte boundary) for the forward and both paths.
TEST(CrossEntropyGpu, MisalignedBase) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  RunBoth({"base", 37, 4096, 4096, 4096, /*in_offset=*/3, /*out_offset=*/3});
}

// dlogits written over the logits.
TEST(CrossEntropyGpu, InPlace) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  CeCase c{"inplace", 37, 8003, 8003, 8003};
  c.in_place = true;
  RunBoth(c);
  c = {"inplace-aligned", 16, 4096, 4096, 4096};
  c.in_place = true;
  RunBoth(c);
  c = {"inplace-padded", 37, 1000, 1003, 1003, /*in_offset=*/5};
  c.in_place = true;
  RunBoth(c);
}

// Upstream gradient as one scalar (stride 0), per row (stride 1) and absent (1).
TEST(CrossEntropyGpu, GradModes) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  CeCase c{"grad-scalar", 37, 8003, 8003, 8003};
  c.grad = GradMode::kScalar;
  RunBoth(c);
  c.name = "grad-none";
  c.grad = GradMode::kNone;
  RunBoth(c);
}

// Labels outside [0, vocab): NaN loss and NaN gradient for those rows only; many ignored rows.
TEST(CrossEntropyGpu, InvalidAndIgnoredLabels) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  CeCase c{"invalid", 37, 8003, 8003, 8003};
  c.invalid_labels = true;
  c.ignore_frac = 0.5;
  RunBoth(c);
}

TEST(CrossEntropyGpu, RejectsBadArguments) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  DeviceBuffer x(64, DType::kF32), out(64, DType::kF32), labels(8, DType::kF32), f(8, DType::kF32);
  const auto* lab = labels.as<int64_t>();
  float* fp = f.as<float>();
  const DType t = DType::kF32;
  EXPECT_EQ(CrossEntropyForward(t, x.get(), 7, lab, fp, fp, 2, 8, kIgnore, nullptr), cudaErrorInvalidValue)
      << "ld < vocab";
  EXPECT_EQ(CrossEntropyForward(t, x.get(), 8, lab, fp, fp, 2, 0, kIgnore, nullptr), cudaErrorInvalidValue)
      << "vocab 0";
  EXPECT_EQ(CrossEntropyForward(t, nullptr, 8, lab, fp, fp, 2, 8, kIgnore, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(CrossEntropyForward(t, x.as<char>() + 1, 8, lab, fp, fp, 2, 8, kIgnore, nullptr),
            cudaErrorInvalidValue)
      << "misaligned";
  EXPECT_EQ(CrossEntropyForward(t, x.get(), 8, lab, fp, fp, 0, 8, kIgnore, nullptr), cudaSuccess) << "rows 0";
  EXPECT_EQ(CrossEntropyBackward(t, x.get(), 8, lab, fp, fp, 0, x.as<float>() + 1, 8, 2, 8, kIgnore, nullptr),
            cudaErrorInvalidValue)
      << "partial overlap";
  EXPECT_EQ(CrossEntropyBackward(t, x.get(), 8, lab, fp, fp, 0, x.get(), 9, 2, 8, kIgnore, nullptr),
            cudaErrorInvalidValue)
      << "same base, different stride";
  EXPECT_EQ(CrossEntropyBackward(t, x.get(), 8, lab, fp, fp, -1, out.get(), 8, 2, 8, kIgnore, nullptr),
            cudaErrorInvalidValue)
      << "negative grad_stride";
  EXPECT_EQ(CrossEntropyBackward(t, x.get(), 8, lab, fp, fp, 0, out.get(), 7, 2, 8, kIgnore, nullptr),
            cudaErrorInvalidValue)
      << "ld_out < vocab";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace ftd::kernels

// FP8 casts in 64x64 tiles, for the layouts cuBLASLt's FP8 GEMMs take: both operands K-major, so a
// matrix used once with its rows and once with its columns as the reduction needs a transposed copy.
// One launch casts a matrix made of up to kFp8MaxSources sources, concatenated along its columns or its
// rows, into FP8 row-major, transposed, or both, with per-tensor scaling from the whole matrix's amax
// (computed in the same launch, or given); a second launcher transposes FP8 bytes. Contract, precision
// and the tail/alignment rules are at the top of kernels/fp8_tiles.cu; the CPU reference is
// kernels/fp8_tiles_ref.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common.h"
#include "kernels/fp8_cast.h"
#include "kernels/launch_plan.h"

namespace ftd::kernels {

inline constexpr int kFp8MaxSources = 4;

// One source of the concatenated matrix: rows x cols elements of the launch's dtype, row-major with
// `ld` elements between row starts (ld >= cols). ptr == nullptr: a source of zeros (an unused
// projection's gradient). amax: with Fp8ScaleFrom::kGiven, this source's amax (one fp32 on the device).
struct Fp8Source {
  const void* ptr = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
  const float* amax = nullptr;
};

// How the sources form the matrix S [R, C]:
//   kCols: S = [s0 | s1 | ...], every source with the same rows R0, C = sum of cols;
//   kRows: S = [s0; s1; ...], every source with the same cols C, R0 = sum of rows.
// R = rows_out >= R0: the rows R0..R-1 are zeros (a token count padded to a multiple of 16).
enum class Fp8Concat { kCols, kRows };

// kCompute: amax (=) max |S| over its finite elements, computed first (a launch of its own), then the
// cast. kGiven: amax (=) the largest of the sources' amax values, which the caller computed before (the
// scale of a weight known from its forward cast).
enum class Fp8ScaleFrom { kCompute, kGiven };

struct Fp8TileCast {
  DType dtype = DType::kBF16;          // the sources' element type (kBF16 or kF32)
  Fp8Format format = Fp8Format::kE4M3;
  Fp8Concat concat = Fp8Concat::kCols;
  Fp8ScaleFrom scale_from = Fp8ScaleFrom::kCompute;
  Fp8Source sources[kFp8MaxSources];
  int num_sources = 0;                 // 1..kFp8MaxSources
  int64_t rows_out = 0;                // R (0: R0, no padding)
  uint8_t* out = nullptr;              // (=) [R, C] row-major, or nullptr
  uint8_t* out_t = nullptr;            // (=) [C, R] row-major (S transposed), or nullptr
  float* amax = nullptr;               // (=) one fp32 on the device
  float* scale_inv = nullptr;          // (=) one fp32 on the device: 1 / scale
};

// out[r, c] = out_t[c, r] = fp8(S[r, c] * scale) with scale = min(Fp8Max / amax, FLT_MAX), or 1 when
// amax is 0; the same rounding, saturation and NaN rules as Fp8CastAmax (kernels/fp8_cast.h), so given
// the scale the bytes equal Fp8CastAmax's of the same values. At least one of out, out_t; neither may
// overlap a source. props: the current device's (QueryDeviceProps).
cudaError_t Fp8CastTiles(const DeviceProps& props, const Fp8TileCast& p, cudaStream_t stream);

// out [cols, rows] = in [rows, cols] transposed, one byte an element (FP8 of either format: the bytes
// are copied, the scale is unchanged). in and out must not overlap.
cudaError_t Fp8Transpose(const DeviceProps& props, const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out,
                         cudaStream_t stream);

}  // namespace ftd::kernels

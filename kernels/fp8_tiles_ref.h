// Plain C++ reference of kernels/fp8_tiles.cu, written for clarity: the matrix the sources form,
// element by element, and the transpose of a byte matrix. The cast itself is fp8_cast_ref's (Fp8Cast
// with the scale of the matrix's amax); the GPU test compares every output byte with these.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/fp8_tiles.h"

namespace ftd::kernels::ref {

// One source: rows x cols values read from data[r * ld + c]; data == nullptr: zeros.
struct TileSource {
  const std::vector<float>* data = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
};

// S [R, C] row-major, the sources concatenated as `concat` says (kernels/fp8_tiles.h), with zero rows
// up to rows_out (0: none). Sets *R and *C.
std::vector<float> ConcatMatrix(const std::vector<TileSource>& sources, Fp8Concat concat, int64_t rows_out,
                                int64_t* R, int64_t* C);

// out [cols, rows] with out[c * rows + r] = in[r * cols + c].
std::vector<uint8_t> TransposeBytes(const std::vector<uint8_t>& in, int64_t rows, int64_t cols);

}  // namespace ftd::kernels::ref

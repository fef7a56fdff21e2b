#include "kernels/fp8_tiles_ref.h"

namespace ftd::kernels::ref {

std::vector<float> ConcatMatrix(const std::vector<TileSource>& sources, Fp8Concat concat, int64_t rows_out,
                                int64_t* R, int64_t* C) {
  int64_t r0 = 0, c0 = 0;
  for (const auto& s : sources) {
    if (concat == Fp8Concat::kCols) {
      r0 = s.rows;
      c0 += s.cols;
    } else {
      r0 += s.rows;
      c0 = s.cols;
    }
  }
  *R = rows_out > r0 ? rows_out : r0;
  *C = c0;
  std::vector<float> m(static_cast<size_t>(*R * *C), 0.f);
  int64_t at = 0;  // the first column (kCols) or row (kRows) of the current source
  for (const auto& s : sources) {
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t c = 0; c < s.cols; ++c) {
        const float v = s.data == nullptr ? 0.f : (*s.data)[static_cast<size_t>(r * s.ld + c)];
        const int64_t mr = concat == Fp8Concat::kCols ? r : at + r;
        const int64_t mc = concat == Fp8Concat::kCols ? at + c : c;
        m[static_cast<size_t>(mr * *C + mc)] = v;
      }
    }
    at += concat == Fp8Concat::kCols ? s.cols : s.rows;
  }
  return m;
}

std::vector<uint8_t> TransposeBytes(const std::vector<uint8_t>& in, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out(in.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(c * rows + r)] = in[static_cast<size_t>(r * cols + c)];
  }
  return out;
}

}  // namespace ftd::kernels::ref

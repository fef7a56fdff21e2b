// The tiled casts' reference against direct descriptions: a concatenation along columns is each row
// of the sources one after the other, along rows the sources stacked, padding rows are zero, a null
// source is zeros, a leading dimension skips the elements between rows; a transpose moves (r, c) to
// (c, r) and twice is the identity.
#include "kernels/fp8_tiles_ref.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

namespace ftd::kernels {
namespace {

std::vector<float> Iota(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(Fp8TilesRef, ConcatAlongColumnsWithPaddingAndStride) {
  const auto a = Iota(3 * 5, 1), b = Iota(3 * 2, 100);  // a: 3 x 4 with ld 5; b: 3 x 2
  int64_t R = 0, C = 0;
  const auto m = ref::ConcatMatrix({{&a, 3, 4, 5}, {nullptr, 3, 3, 3}, {&b, 3, 2, 2}}, Fp8Concat::kCols, 5, &R, &C);
  ASSERT_EQ(R, 5);
  ASSERT_EQ(C, 9);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      float want = 0;
      if (r < 3 && c < 4) want = a[r * 5 + c];
      if (r < 3 && c >= 7) want = b[r * 2 + (c - 7)];
      EXPECT_EQ(m[r * C + c], want) << r << "," << c;
    }
  }
}

TEST(Fp8TilesRef, ConcatAlongRows) {
  const auto a = Iota(2 * 3, 1), b = Iota(4 * 3, 50);
  int64_t R = 0, C = 0;
  const auto m = ref::ConcatMatrix({{&a, 2, 3, 3}, {&b, 4, 3, 3}}, Fp8Concat::kRows, 0, &R, &C);
  ASSERT_EQ(R, 6);
  ASSERT_EQ(C, 3);
  std::vector<float> want(a);
  want.insert(want.end(), b.begin(), b.end());
  EXPECT_EQ(m, want);
}

TEST(Fp8TilesRef, TransposeBytes) {
  std::mt19937 rng(7);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 70}, {65, 17}, {128, 64}}) {
    std::vector<uint8_t> in(static_cast<size_t>(rows * cols));
    for (auto& b : in) b = static_cast<uint8_t>(rng());
    const auto t = ref::TransposeBytes(in, rows, cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(t[c * rows + r], in[r * cols + c]);
    }
    EXPECT_EQ(ref::TransposeBytes(t, cols, rows), in);
  }
}

}  // namespace
}  // namespace ftd::kernels

#include "kernels/rope_ref.h"

namespace ftd::kernels::ref {
namespace {

// sign = +1: the forward rotation; -1: its transpose (the backward).
void Rotate(const std::vector<double>& in, const std::vector<double>& cos, const std::vector<double>& sin,
            int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, double sign, std::vector<double>* out) {
  const int64_t h = head_dim / 2;
  out->assign(in.size(), 0.0);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      for (int64_t hd = 0; hd < heads; ++hd) {
        const int64_t row = ((b * seq + t) * heads + hd) * head_dim;
        for (int64_t i = 0; i < h; ++i) {
          const double c = cos[t * h + i], s = sign * sin[t * h + i];
          const double x1 = in[row + i], x2 = in[row + i + h];
          (*out)[row + i] = x1 * c - x2 * s;
          (*out)[row + i + h] = x2 * c + x1 * s;
        }
      }
    }
  }
}

}  // namespace

void RopeForward(const std::vector<double>& x, const std::vector<double>& cos, const std::vector<double>& sin,
                 int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, std::vector<double>* out) {
  Rotate(x, cos, sin, batch, seq, heads, head_dim, 1.0, out);
}

void RopeBackward(const std::vector<double>& dout, const std::vector<double>& cos, const std::vector<double>& sin,
                  int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, std::vector<double>* dx) {
  Rotate(dout, cos, sin, batch, seq, heads, head_dim, -1.0, dx);
}

}  // namespace ftd::kernels::ref

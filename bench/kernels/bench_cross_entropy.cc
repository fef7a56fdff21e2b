// Cross-entropy benchmark: our online-softmax forward + backward (kernels/cross_entropy.h) against
// the engine's eager path (logits.to(float32), torch cross_entropy with reduction sum and
// ignore_index -100, backward through autograd), on [tokens, vocab] logits.
#include <ATen/cuda/CUDAContext.h>

#include <string>

#include "bench/kernels/bench.h"
#include "kernels/cross_entropy.h"

namespace ftd::bench {
namespace {

constexpr int64_t kIgnoreIndex = -100;

kernels::DType KDType(torch::ScalarType t) { return t == torch::kFloat ? kernels::DType::kF32 : kernels::DType::kBF16; }

void Ok(cudaError_t e, const char* what) { TORCH_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e)); }

}  // namespace

void BenchCrossEntropy(const BenchConfig& cfg, std::vector<Row>& rows) {
  const auto opts = torch::TensorOptions().dtype(cfg.dtype).device(torch::kCUDA);
  const auto f32 = opts.dtype(torch::kFloat);
  const int64_t vocab = cfg.vocab;
  const kernels::DType dt = KDType(cfg.dtype);
  const double esize = static_cast<double>(torch::elementSize(cfg.dtype));
  for (const int64_t tokens : cfg.tokens) {
    // Every label valid, so both sides read every row (ignored rows would let ours skip theirs).
    const auto logits = 2 * torch::randn({tokens, vocab}, opts);
    const auto labels = torch::randint(0, vocab, {tokens}, opts.dtype(torch::kLong));
    const auto grad_sum = torch::ones({1}, f32);  // d(sum of losses)/d(loss_r) = 1 for every row

    // Ours: outputs allocated per call, as the autograd adapter does; the adapter's forward returns
    // loss.sum() and its backward calls CrossEntropyBackward with the incoming scalar gradient.
    auto ours = [&] {
      const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
      auto loss = torch::empty({tokens}, f32);
      auto lse = torch::empty({tokens}, f32);
      auto dlogits = torch::empty({tokens, vocab}, opts);
      Ok(kernels::CrossEntropyForward(dt, logits.data_ptr(), vocab, labels.data_ptr<int64_t>(), loss.data_ptr<float>(),
                                      lse.data_ptr<float>(), tokens, vocab, kIgnoreIndex, stream),
         "CrossEntropyForward");
      const auto total = loss.sum();
      Ok(kernels::CrossEntropyBackward(dt, logits.data_ptr(), vocab, labels.data_ptr<int64_t>(), lse.data_ptr<float>(),
                                       grad_sum.data_ptr<float>(), /*grad_stride=*/0, dlogits.data_ptr(), vocab, tokens,
                                       vocab, kIgnoreIndex, stream),
         "CrossEntropyBackward");
    };

    // Eager: LlamaModel::LossSum's loss on given logits, then autograd for dlogits.
    const auto leaf = logits.detach().requires_grad_(true);
    auto eager = [&] {
      const auto loss = torch::nn::functional::cross_entropy(
          leaf.to(torch::kFloat), labels,
          torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));
      const auto grads = torch::autograd::grad({loss}, {leaf});
      TORCH_CHECK(grads.size() == 1);
    };

    Row r;
    r.family = "cross_entropy";
    r.variant = "fwd+bwd";
    r.tokens = tokens;
    r.ours_us = TimeUs(ours, cfg);
    r.eager_us = TimeUs(eager, cfg);
    // Forward: logits and labels read, loss and lse written. Backward: logits, labels and lse read,
    // dlogits written. The logits are read once by each pass: 3 x tokens x vocab elements in all.
    const double t = static_cast<double>(tokens), v = static_cast<double>(vocab);
    r.bytes = 3 * t * v * esize + t * (8 + 4 + 4) + t * (8 + 4) + 4;
    r.ours_peak_bytes = PeakBytes(ours);
    r.eager_peak_bytes = PeakBytes(eager);
    r.note = std::string(c10::toString(cfg.dtype)) + " [" + std::to_string(tokens) + ", " + std::to_string(vocab) +
             "]; bytes = fwd read + bwd read + write of the logits";
    rows.push_back(r);
  }
}

}  // namespace ftd::bench

// Activation checkpointing (spec.activation_checkpointing) on the tiny LLaMA in fp32: selective and
// full give the losses and gradients of `none` (the same ops on the same values, so equal to within
// rounding of a different summation order, <= 1e-6), on the eager set and with LoRA (grouped and
// eager adapters, and eager adapters with dropout, whose masks the rerun must draw again); and each
// mode keeps less: full records one node per layer, selective frees the storage it recomputes.
// The Gpu cases run the fused kernel set on CUDA (model_gpu_test, label gpu).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "worker/engine/model/model.h"
#include "worker/engine/model/recompute.h"

namespace ftd::engine {
namespace {

using spec::ActivationCheckpointing;

struct Result {
  double loss = 0;
  std::vector<std::pair<std::string, torch::Tensor>> grads;
  size_t graph_nodes = 0;
  int64_t peak_bytes = 0;  // CUDA: the caching allocator's high-water mark over forward and backward
};

// "cuda" names no index: the allocator's statistics want the current device's.
c10::DeviceIndex CudaIndex(const torch::Device& d) {
  return d.has_index() ? d.index() : c10::cuda::current_device();
}

size_t CountNodes(const torch::Tensor& loss) {
  std::set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo = {loss.grad_fn().get()};
  while (!todo.empty()) {
    auto* n = todo.back();
    todo.pop_back();
    if (n == nullptr || !seen.insert(n).second) continue;
    for (const auto& e : n->next_edges()) todo.push_back(e.function.get());
  }
  return seen.size();
}

struct Case {
  std::string device = "cpu";
  bool fused = false;
  bool lora = false;
  bool grouped_lora = true;  // the `lora` op fused (grouped adapters) or eager
  double dropout = 0;
  int64_t micro_batches = 1;
  int64_t batch = 3, seq = 17;
};

Result RunCase(const Case& s, ActivationCheckpointing ac) {
  const torch::Device device(s.device);
  auto cfg = *spec::PresetLlamaConfig("tiny");
  auto model = *LlamaModel::Create(cfg, device, torch::kFloat, /*seed=*/3);
  TrainConfig tc;
  tc.kernel_set = s.fused ? spec::KernelSet::kFused : spec::KernelSet::kEager;
  if (s.lora) tc.kernels["lora"] = s.grouped_lora ? spec::KernelSet::kFused : spec::KernelSet::kEager;
  model->SetKernels(tc.Kernels());
  model->SetActivationCheckpointing(ac);
  if (s.lora) {
    spec::LoraConfig lc;
    lc.enabled = true;
    lc.rank = 4;
    lc.dropout = s.dropout;
    EXPECT_TRUE(model->EnableLora(lc, 5).ok());
    // B starts at zero; non-zero B makes every adapter's gradient non-trivial.
    torch::NoGradGuard no_grad;
    torch::manual_seed(11);
    for (const auto& [name, t] : model->trainable_parameters()) {
      if (name.find("lora_B") != std::string::npos) t.normal_(0, 0.05);
    }
  }
  torch::manual_seed(42);  // the data, and the dropout masks after it
  Result r;
  const int64_t B = s.batch, T = s.seq;
  if (device.is_cuda()) {
    torch::cuda::synchronize();
    c10::cuda::CUDACachingAllocator::resetPeakStats(CudaIndex(device));
  }
  auto count = torch::full({}, static_cast<double>(B * T * s.micro_batches),
                           torch::TensorOptions().dtype(torch::kFloat).device(device));
  for (int64_t m = 0; m < s.micro_batches; ++m) {
    auto ids = torch::randint(0, cfg.vocab_size, {B, T}, torch::kInt64).to(device);
    auto labels = torch::randint(0, cfg.vocab_size, {B, T}, torch::kInt64).to(device);
    auto loss = model->LossMean(ids, labels, count);
    r.graph_nodes = CountNodes(loss);
    loss.backward();
    r.loss += loss.item<double>();
  }
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(CudaIndex(device));
    r.peak_bytes = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }
  for (const auto& [name, p] : model->trainable_parameters()) {
    EXPECT_TRUE(p.grad().defined()) << name;
    r.grads.emplace_back(name, p.grad().to(torch::kCPU).clone());
  }
  return r;
}

// CPU: the same ops in the same order, <= 1e-6. CUDA: attention's backward may accumulate with
// atomics (an order that changes from run to run, none against none included): <= 1e-4.
void ExpectSame(const Result& want, const Result& got, double tol) {
  EXPECT_NEAR(got.loss, want.loss, tol * std::abs(want.loss));
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < want.grads.size(); ++i) {
    const auto& w = want.grads[i].second;
    const auto& g = got.grads[i].second;
    const double scale = std::max(w.abs().max().item<double>(), 1e-12);
    EXPECT_LE((g - w).abs().max().item<double>(), tol * scale) << want.grads[i].first;
  }
}

void CheckAllModes(const Case& s) {
  const Result none = RunCase(s, ActivationCheckpointing::kNone);
  const Result selective = RunCase(s, ActivationCheckpointing::kSelective);
  const Result full = RunCase(s, ActivationCheckpointing::kFull);
  const double tol = s.device == "cpu" ? 1e-6 : 1e-4;
  {
    SCOPED_TRACE("selective");
    ExpectSame(none, selective, tol);
  }
  {
    SCOPED_TRACE("full");
    ExpectSame(none, full, tol);
  }
  // Full checkpointing leaves one node per layer in the graph: the tiny model's 4 layers record a
  // few dozen nodes each without it.
  EXPECT_LT(full.graph_nodes * 3, none.graph_nodes) << full.graph_nodes << " vs " << none.graph_nodes;
}

TEST(ActivationCheckpointing, EagerFullFineTuningMatchesNone) { CheckAllModes({}); }

TEST(ActivationCheckpointing, AccumulatedMicroBatchesMatchNone) {
  Case s;
  s.micro_batches = 2;
  CheckAllModes(s);
}

TEST(ActivationCheckpointing, GroupedLoraMatchesNone) {
  Case s;
  s.lora = true;
  CheckAllModes(s);
}

TEST(ActivationCheckpointing, EagerLoraWithDropoutMatchesNone) {
  Case s;
  s.lora = true;
  s.grouped_lora = false;
  s.dropout = 0.25;
  CheckAllModes(s);
  // The masks matter: another draw gives other gradients (so equality above is not by accident).
  Case other = s;
  other.dropout = 0.3;
  const Result a = RunCase(s, ActivationCheckpointing::kNone), b = RunCase(other, ActivationCheckpointing::kNone);
  EXPECT_GT((a.grads[0].second - b.grads[0].second).abs().max().item<double>(), 1e-6);
}

TEST(RecomputeInBackward, FreesTheStorageAndRefillsItForBackward) {
  torch::manual_seed(1);
  auto a = torch::randn({64, 32}, torch::requires_grad());
  auto w = torch::randn({32, 16}, torch::requires_grad());
  auto want_loss = [&] {
    auto t = torch::tanh(a);
    return t.mm(w).pow(2).sum();
  }();
  want_loss.backward();
  const auto wa = a.grad().clone(), ww = w.grad().clone();
  a.mutable_grad().reset();
  w.mutable_grad().reset();

  auto t = torch::tanh(a);
  auto y = t.mm(w);  // saves t for w's gradient
  int recomputed = 0;
  RecomputeInBackward(t, {y}, [&] {
    ++recomputed;
    return torch::tanh(a);
  });
  EXPECT_EQ(t.storage().nbytes(), 0u);  // freed until backward
  EXPECT_EQ(recomputed, 0);
  auto loss = y.pow(2).sum();
  loss.backward();
  EXPECT_EQ(recomputed, 1);
  EXPECT_EQ(t.storage().nbytes(), 64u * 32 * 4);
  EXPECT_TRUE(torch::equal(a.grad(), wa));
  EXPECT_TRUE(torch::equal(w.grad(), ww));
  EXPECT_NEAR(loss.item<double>(), want_loss.item<double>(), 0);
}

TEST(RecomputeInBackward, DoesNothingWithoutGradients) {
  torch::NoGradGuard no_grad;
  auto t = torch::ones({8});
  RecomputeInBackward(t, {t * 2}, [] { return torch::ones({8}); });
  EXPECT_EQ(t.storage().nbytes(), 8u * 4);
}

// The fused kernel set (fp32) on CUDA.
class ActivationCheckpointingGpu : public testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// The fused set on CUDA; `lora`: 0 none, 1 grouped adapters, 2 eager adapters with dropout.
Case Fused(int lora) {
  Case s;
  s.device = "cuda";
  s.fused = true;
  s.lora = lora > 0;
  s.grouped_lora = lora == 1;
  s.dropout = lora == 2 ? 0.25 : 0.0;
  return s;
}

TEST_F(ActivationCheckpointingGpu, FusedFullFineTuningMatchesNone) { CheckAllModes(Fused(0)); }
TEST_F(ActivationCheckpointingGpu, FusedGroupedLoraMatchesNone) { CheckAllModes(Fused(1)); }
TEST_F(ActivationCheckpointingGpu, FusedEagerLoraWithDropoutMatchesNone) { CheckAllModes(Fused(2)); }

TEST_F(ActivationCheckpointingGpu, EachModeHoldsLessAtItsPeak) {
  // 16 x 256 tokens: the activations outweigh the tiny model's weights, gradients and state.
  Case s = Fused(0);
  s.batch = 16;
  s.seq = 256;
  const auto none = RunCase(s, ActivationCheckpointing::kNone);
  const auto selective = RunCase(s, ActivationCheckpointing::kSelective);
  const auto full = RunCase(s, ActivationCheckpointing::kFull);
  EXPECT_LT(selective.peak_bytes, none.peak_bytes);
  EXPECT_LT(full.peak_bytes, selective.peak_bytes);
  std::cout << "peak allocated: none " << none.peak_bytes << ", selective " << selective.peak_bytes << ", full "
            << full.peak_bytes << " bytes\n";
}

}  // namespace
}  // namespace ftd::engine

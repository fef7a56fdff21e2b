// spec.kernel_tuning.fused_projections on the tiny LLaMA in fp32 (CPU, eager set): q/k/v and gate/up
// become row blocks of one buffer each and run as one GEMM, with the losses and gradients of the
// split projections (losses <= 1e-6; gradients <= 1e-5 of their largest element: one GEMM instead of
// two or three sums the input's gradient in another order), alone, with selective checkpointing and with LoRA on some targets;
// weights written by a fused model keep HF's split names and load into either layout.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "worker/engine/model/model.h"
#include "worker/engine/core/safetensors.h"
#include "worker/engine/test_tmpdir.h"

namespace ftd::engine {
namespace {

std::unique_ptr<LlamaModel> Tiny(bool fused, spec::ActivationCheckpointing ac = spec::ActivationCheckpointing::kNone,
                                 bool lora = false, bool cuda = false) {
  const torch::Device device = cuda ? torch::kCUDA : torch::kCPU;
  auto model = *LlamaModel::Create(*spec::PresetLlamaConfig("tiny"), device, torch::kFloat, /*seed=*/9);
  spec::KernelTuning tuning;
  tuning.fused_projections = fused;
  TrainConfig tc;
  if (cuda) tc.kernel_set = spec::KernelSet::kFused;  // SwiGLU reads the gate|up GEMM's output in place
  model->SetKernels(tc.Kernels(), tuning);
  model->SetActivationCheckpointing(ac);
  if (lora) {
    spec::LoraConfig lc;
    lc.enabled = true;
    lc.rank = 4;
    lc.target_modules = {"q", "v", "down"};  // q/k/v adapted (split GEMMs), gate/up fused
    EXPECT_TRUE(model->EnableLora(lc, 5).ok());
    torch::NoGradGuard no_grad;
    torch::manual_seed(11);
    for (const auto& [name, t] : model->trainable_parameters()) {
      if (name.find("lora_B") != std::string::npos) t.normal_(0, 0.05);
    }
  }
  return model;
}

struct Result {
  double loss;
  std::vector<std::pair<std::string, torch::Tensor>> grads;
};

Result Step(LlamaModel& m) {
  torch::manual_seed(42);
  auto ids = torch::randint(0, 64, {3, 19}, torch::kInt64).to(m.device());
  auto labels = torch::randint(0, 64, {3, 19}, torch::kInt64).to(m.device());
  auto loss = m.LossMean(ids, labels, torch::full({}, 57.0, torch::TensorOptions().device(m.device())));
  loss.backward();
  Result r{loss.item<double>(), {}};
  for (const auto& [name, p] : m.trainable_parameters()) r.grads.emplace_back(name, p.grad().cpu().clone());
  return r;
}

void ExpectSame(const Result& want, const Result& got, double grad_tol = 1e-5) {
  EXPECT_NEAR(got.loss, want.loss, 1e-6 * std::abs(want.loss));
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < want.grads.size(); ++i) {
    ASSERT_EQ(got.grads[i].first, want.grads[i].first);
    const double scale = std::max(want.grads[i].second.abs().max().item<double>(), 1e-12);
    EXPECT_LE((got.grads[i].second - want.grads[i].second).abs().max().item<double>(), grad_tol * scale)
        << want.grads[i].first;
  }
}

const torch::Tensor& Named(const LlamaModel& m, const std::string& name) {
  for (const auto& [n, t] : m.named_parameters()) {
    if (n == name) return t;
  }
  static const torch::Tensor none;
  return none;
}

TEST(FusedProjections, WeightsShareOneBufferPerGroup) {
  auto m = Tiny(true);
  const auto& q = Named(*m, "model.layers.1.self_attn.q_proj.weight");
  const auto& v = Named(*m, "model.layers.1.self_attn.v_proj.weight");
  const auto& gate = Named(*m, "model.layers.1.mlp.gate_proj.weight");
  const auto& up = Named(*m, "model.layers.1.mlp.up_proj.weight");
  EXPECT_TRUE(q.storage().is_alias_of(v.storage()));
  EXPECT_TRUE(gate.storage().is_alias_of(up.storage()));
  EXPECT_FALSE(q.storage().is_alias_of(gate.storage()));
  EXPECT_TRUE(q.is_leaf() && q.requires_grad() && q.is_contiguous());
  auto split = Tiny(false);
  EXPECT_FALSE(Named(*split, "model.layers.1.self_attn.q_proj.weight")
                   .storage()
                   .is_alias_of(Named(*split, "model.layers.1.self_attn.v_proj.weight").storage()));
  // The same values as the split model drawn from the same seed.
  EXPECT_TRUE(torch::equal(q, Named(*split, "model.layers.1.self_attn.q_proj.weight")));
}

TEST(FusedProjections, SameLossesAndGradientsAsSplit) {
  ExpectSame(Step(*Tiny(false)), Step(*Tiny(true)));
}

TEST(FusedProjections, WithSelectiveCheckpointingAndLora) {
  using spec::ActivationCheckpointing;
  ExpectSame(Step(*Tiny(false)), Step(*Tiny(true, ActivationCheckpointing::kSelective)));
  ExpectSame(Step(*Tiny(false, ActivationCheckpointing::kNone, true)),
             Step(*Tiny(true, ActivationCheckpointing::kFull, true)));
  ExpectSame(Step(*Tiny(false, ActivationCheckpointing::kNone, true)),
             Step(*Tiny(true, ActivationCheckpointing::kSelective, true)));
}

TEST(FusedProjections, WeightsKeepHfNamesAndLoadIntoEitherLayout) {
  const std::string dir = TempDir().string();
  auto fused = Tiny(true);
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, t] : fused->named_parameters()) t.add_(0.01 * torch::randn_like(t));
  }
  ASSERT_TRUE(fused->SaveWeights(dir).ok());
  auto file = SafetensorsFile::Open((std::filesystem::path(dir) / "model.safetensors").string());
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> names;
  for (const auto& t : (*file)->tensors()) names.push_back(t.name);
  auto split = Tiny(false);
  std::vector<std::string> want;
  for (const auto& [n, t] : split->named_parameters()) want.push_back(n);
  std::sort(names.begin(), names.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names, want);
  ASSERT_TRUE(split->LoadWeights(dir).ok());
  auto refused = Tiny(true);
  ASSERT_TRUE(refused->LoadWeights(dir).ok());
  torch::NoGradGuard no_grad;
  auto ids = torch::randint(0, 64, {2, 11}, torch::kInt64);
  const auto a = fused->Logits(ids), b = split->Logits(ids), c = refused->Logits(ids);
  EXPECT_LE((a - b).abs().max().item<double>(), 1e-5);
  EXPECT_TRUE(torch::equal(a, c));
}

// The fused kernel set (fp32) on CUDA: the packed SwiGLU kernel against split GEMMs and the plain one
// (gradients within 1e-4: cuBLAS picks other algorithms for other GEMM shapes, and attention's backward
// may accumulate in another order).
TEST(FusedProjectionsGpu, SameLossesAndGradientsAsSplit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  using spec::ActivationCheckpointing;
  ExpectSame(Step(*Tiny(false, ActivationCheckpointing::kNone, false, true)),
             Step(*Tiny(true, ActivationCheckpointing::kNone, false, true)), 1e-4);
  ExpectSame(Step(*Tiny(false, ActivationCheckpointing::kNone, false, true)),
             Step(*Tiny(true, ActivationCheckpointing::kSelective, false, true)), 1e-4);
}

}  // namespace
}  // namespace ftd::engine

// The peak-memory prediction against peaks measured on an H200 (docs/performance.md: the 8B step,
// full fine-tuning, bf16, as the caching allocator reported them), and its structure for LoRA.
#include "spec/peak_memory.h"

#include <gtest/gtest.h>

namespace ftd::spec {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

TrainConfig Job(int batch, int seq, const std::string& kernel_set) {
  TrainConfig c;
  c.batch_size = batch;
  c.seq_len = seq;
  c.kernel_set = *ParseKernelSet(kernel_set);
  c.dtype = "bf16";
  return c;
}

TEST(PeakMemory, FullFineTuningWithinTenPercentOfMeasuredH200Peaks) {
  const auto m = *PresetLlamaConfig("llama-3.1-8b");
  struct Case {
    int batch, seq;
    const char* kernel_set;
    double measured_gib;  // peak allocated, docs/performance.md (2026-11-23)
  };
  // fp8: measured 2026-11-27 (docs/performance.md, FP8 after the tile casts; 8x2048 and 2x8192 alike).
  for (const Case& c : {Case{1, 512, "fused", 59.9}, Case{1, 512, "eager", 59.9}, Case{4, 2048, "fused", 80.6},
                        Case{4, 2048, "eager", 106.0}, Case{8, 2048, "fused", 115.1}, Case{4, 2048, "fp8", 76.3},
                        Case{8, 2048, "fp8", 106.5}, Case{2, 8192, "fp8", 106.5}}) {
    const auto p = PredictPeakMemory(m, Job(c.batch, c.seq, c.kernel_set), /*gpu=*/true);
    EXPECT_NEAR(p.Peak() / kGiB, c.measured_gib, 0.1 * c.measured_gib)
        << c.batch << "x" << c.seq << " " << c.kernel_set << ": " << p.ToString();
  }
}

TEST(PeakMemory, ShardedOptimizerStateKeepsItsShareOnEachRank) {
  const auto m = *PresetLlamaConfig("llama-3.1-8b");
  TrainConfig c = Job(4, 2048, "fused");
  c.gpus = 2;
  const auto plain = PredictPeakMemory(m, c, /*gpu=*/true);
  c.optimizer.shard_state = true;
  const auto zero1 = PredictPeakMemory(m, c, /*gpu=*/true);
  EXPECT_DOUBLE_EQ(zero1.optimizer, plain.optimizer / 2);
  EXPECT_DOUBLE_EQ(zero1.weights, plain.weights);
  EXPECT_NEAR((plain.optimizer - zero1.optimizer) / kGiB, 14.96, 0.01);  // half of 2 bf16 moments of 8.03 B
}

TEST(PeakMemory, ShardedGradientsKeepTheirShareOnEachRank) {
  const auto m = *PresetLlamaConfig("llama-3.1-8b");
  TrainConfig c = Job(4, 2048, "fused");
  c.gpus = 8;
  c.optimizer.shard_state = true;
  const auto zero1 = PredictPeakMemory(m, c, /*gpu=*/true);
  c.optimizer.shard_grads = true;
  const auto zero2 = PredictPeakMemory(m, c, /*gpu=*/true);
  EXPECT_DOUBLE_EQ(zero2.optimizer, zero1.optimizer);
  // 1/8 of the bf16 gradients of 8.03 B (14.96 GiB) and two 256 MiB buckets in flight.
  EXPECT_NEAR(zero2.gradients / kGiB, 14.96 / 8 + 0.5, 0.01);
  // With accumulation every gradient is kept until the last micro-batch's backward.
  c.grad_accum_steps = 2;
  EXPECT_DOUBLE_EQ(PredictPeakMemory(m, c, true).gradients, zero1.gradients);
}

TEST(PeakMemory, LoraHoldsTheFrozenBaseAndLittleElse) {
  const auto m = *PresetLlamaConfig("llama-3.1-8b");
  auto c = Job(1, 512, "fused");
  c.lora.enabled = true;
  c.lora.rank = 16;
  const auto p = PredictPeakMemory(m, c, true);
  EXPECT_NEAR(p.weights / kGiB, 14.96 + 0.16, 0.02);  // bf16 base + 42M fp32 adapter weights
  EXPECT_NEAR(p.optimizer / kGiB, 0.31, 0.01);
  EXPECT_LT(p.Peak(), PredictPeakMemory(m, Job(1, 512, "fused"), true).Peak() / 3);
  // Activations grow with the tokens of a micro-batch; the grouped lora op saves less than eager,
  // which keeps an fp32 copy of every adapter's input.
  auto big = c;
  big.batch_size = 4;
  big.seq_len = 2048;
  const auto pb = PredictPeakMemory(m, big, true);
  EXPECT_NEAR(pb.activations / p.activations, 16.0, 0.5);
  auto eager_lora = big;
  eager_lora.kernels["lora"] = KernelSet::kEager;
  EXPECT_GT(PredictPeakMemory(m, eager_lora, true).activations, pb.activations * 1.3);
  // Fewer targets, fewer saved inputs.
  auto qv = big;
  qv.lora.target_modules = {"q", "v"};
  EXPECT_LT(PredictPeakMemory(m, qv, true).activations, pb.activations);
  // Gradient accumulation does not add activations (one micro-batch at a time).
  auto accum = big;
  accum.grad_accum_steps = 8;
  EXPECT_NEAR(PredictPeakMemory(m, accum, true).Peak(), pb.Peak(), 1e6);
}

TEST(PeakMemory, ActivationCheckpointingSavesLessForEachMode) {
  const auto m = *PresetLlamaConfig("llama-3.1-8b");
  for (const bool lora : {false, true}) {
    for (const char* kernel_set : {"fused", "eager"}) {
      auto c = Job(4, 2048, kernel_set);
      c.lora.enabled = lora;
      c.lora.rank = 16;
      c.lora.dtype = "bf16";  // the adapters' input is the norm's output itself on both kernel sets
      const auto none = PredictPeakMemory(m, c, true);
      c.activation_checkpointing = ActivationCheckpointing::kSelective;
      const auto selective = PredictPeakMemory(m, c, true);
      c.activation_checkpointing = ActivationCheckpointing::kFull;
      const auto full = PredictPeakMemory(m, c, true);
      SCOPED_TRACE(testing::Message() << kernel_set << (lora ? " LoRA" : " full fine-tuning"));
      EXPECT_LT(selective.activations, none.activations);
      EXPECT_LT(full.activations, selective.activations);
      // Full keeps one [tokens, hidden] input per layer plus one layer's recomputed activations.
      EXPECT_LT(full.activations, none.activations / 5);
      EXPECT_EQ(full.weights, none.weights);
      EXPECT_EQ(full.optimizer, none.optimizer);
    }
  }
  // The fused set at 4x2048, full fine-tuning: selective frees the two norm outputs and the SwiGLU
  // product, (2 * 4096 + 14336) * 2 bytes per token and layer, 11 GiB over 32 layers.
  auto c = Job(4, 2048, "fused");
  const double none = PredictPeakMemory(m, c, true).activations;
  c.activation_checkpointing = ActivationCheckpointing::kSelective;
  EXPECT_NEAR((none - PredictPeakMemory(m, c, true).activations) / kGiB, 8192.0 * 32 * (2 * 4096 + 14336) * 2 / kGiB,
              0.01);
  // 8B LoRA (rank 16, all seven targets, fp32 adapters) at 4x2048 on the fused set: full brings the
  // predicted peak from about 50 GiB (measured 50.3) under 30 GiB.
  auto l = Job(4, 2048, "fused");
  l.lora.enabled = true;
  l.lora.rank = 16;
  EXPECT_GT(PredictPeakMemory(m, l, true).Peak() / kGiB, 45);
  l.activation_checkpointing = ActivationCheckpointing::kFull;
  EXPECT_LT(PredictPeakMemory(m, l, true).Peak() / kGiB, 30) << PredictPeakMemory(m, l, true).ToString();
}

// spec.full_checkpoint_layers: the first N layers keep only their input, the others save what
// activation_checkpointing says; each rerun layer saves the same amount, and all of them is `full`.
TEST(PeakMemory, FullCheckpointLayersMoveLinearlyFromTheModeToFull) {
  const auto m = *PresetLlamaConfig("llama-3.1-8b");
  for (const auto mode : {ActivationCheckpointing::kNone, ActivationCheckpointing::kSelective}) {
    auto c = Job(4, 2048, "fused");
    c.lora.enabled = true;
    c.lora.rank = 16;
    c.activation_checkpointing = mode;
    const double base = PredictPeakMemory(m, c, true).activations;
    auto at = [&](int n) {
      auto k = c;
      k.full_checkpoint_layers = n;
      return PredictPeakMemory(m, k, true);
    };
    EXPECT_EQ(at(0).activations, base);
    // one layer's saved activations less an input of [tokens, hidden] bf16, per rerun layer
    const double step = base - at(1).activations;
    EXPECT_GT(step, 0);
    EXPECT_NEAR(base - at(20).activations, 20 * step, 1e3);
    auto full = c;
    full.activation_checkpointing = ActivationCheckpointing::kFull;
    EXPECT_EQ(at(32).activations, PredictPeakMemory(m, full, true).activations);
    EXPECT_EQ(at(100).activations, at(32).activations);
    EXPECT_EQ(at(16).weights, at(0).weights);
  }
  // 8B LoRA r16 at 4x2048: selective with the first 16 layers rerun is predicted under 30 GiB, where
  // selective alone is about 39 GiB (measured 39.7).
  auto l = Job(4, 2048, "fused");
  l.lora.enabled = true;
  l.lora.rank = 16;
  l.activation_checkpointing = ActivationCheckpointing::kSelective;
  EXPECT_GT(PredictPeakMemory(m, l, true).Peak() / kGiB, 38);
  l.full_checkpoint_layers = 16;
  EXPECT_LT(PredictPeakMemory(m, l, true).Peak() / kGiB, 30) << PredictPeakMemory(m, l, true).ToString();
}

// spec.optimizer.overlap frees each layer's gradients once it is updated: at 1x512 (8B, fused set),
// where the gradients (15 GiB) set the peak, only the largest group's (the embedding's, 1 GiB) remain;
// with accumulation every gradient is kept until the last micro-batch.
TEST(PeakMemory, OptimizerOverlapKeepsOneGroupOfGradients) {
  const auto m = *PresetLlamaConfig("llama-3.1-8b");
  auto c = Job(1, 512, "fused");
  const auto plain = PredictPeakMemory(m, c, true);
  c.optimizer.overlap = true;
  c.optimizer.grad_clip = 0;
  const auto overlap = PredictPeakMemory(m, c, true);
  EXPECT_DOUBLE_EQ(overlap.gradients, 128256.0 * 4096 * 2);
  EXPECT_LT(overlap.Peak(), plain.Peak() - 10 * kGiB) << overlap.ToString();
  c.grad_accum_steps = 2;
  EXPECT_DOUBLE_EQ(PredictPeakMemory(m, c, true).gradients, plain.gradients);
}

// The fp8 set keeps no weight copies (each group's E4M3 weights live while it runs) and saves the
// projections' inputs in E4M3: per token and layer, q/k/v's and gate/up's inputs (4096 each) and
// down's (14336) at 1 byte instead of 2, plus o_proj's (4096) at 1 byte beside attention's output.
TEST(PeakMemory, Fp8SavesTheProjectionInputsInE4M3) {
  const auto m = *PresetLlamaConfig("llama-3.1-8b");
  const auto fused = PredictPeakMemory(m, Job(4, 2048, "fused"), true);
  const auto fp8 = PredictPeakMemory(m, Job(4, 2048, "fp8"), true);
  EXPECT_EQ(fp8.weights, fused.weights);
  EXPECT_EQ(fp8.optimizer, fused.optimizer);
  const double per_token_layer = (4096 + 4096 + 14336) * 1.0 - 4096;
  EXPECT_DOUBLE_EQ(fused.activations - fp8.activations, 8192.0 * 32 * per_token_layer);
}

TEST(PeakMemory, ASmallModelIsToldInMiBNotAsZeroGiB) {
  auto m = PresetLlamaConfig("tiny");
  ASSERT_TRUE(m.ok());
  TrainConfig c;
  c.batch_size = 16;
  c.seq_len = 64;
  const std::string text = PredictPeakMemory(*m, c, false).ToString();
  EXPECT_EQ(text.find("0.0 GiB"), std::string::npos) << text;
  EXPECT_EQ(text.find("0.00"), std::string::npos) << text;
  EXPECT_NE(text.find(" MiB"), std::string::npos) << text;
}


// fp32 master weights (docs/job-spec.md) together with ZeRO (docs/distributed.md), by bytes per
// parameter of the 8B (8,030,261,248): the bf16 weights (2) and gradients (2) stay whole on every
// rank; the fp32 masters (4) and fp32 moments (2 x 4) are kept for 1/N of the parameters where the
// state is sharded. ZeRO-2 keeps 1/N of the gradients and two 256 MiB buckets in flight.
TEST(PeakMemory, Fp32MasterWeightsWithShardedStateKeepTheirShareOnEachRank) {
  const auto m = *PresetLlamaConfig("llama-3.1-8b");
  const double n = 8'030'261'248.0;
  for (const int gpus : {1, 2, 8}) {
    for (const bool shard : {false, true}) {
      SCOPED_TRACE(testing::Message() << gpus << " GPU(s)" << (shard ? ", ZeRO-1" : ""));
      TrainConfig c = Job(4, 2048, "fused");
      c.gpus = gpus;
      c.optimizer.shard_state = shard;
      c.fp32_master_weights = true;
      const double ranks = shard ? gpus : 1;
      const auto p = PredictPeakMemory(m, c, /*gpu=*/true);
      EXPECT_DOUBLE_EQ(p.weights, 2 * n + 4 * n / ranks);
      EXPECT_DOUBLE_EQ(p.optimizer, 2 * 4 * n / ranks);
      EXPECT_DOUBLE_EQ(p.gradients, 2 * n);
      // Without masters: bf16 moments of the rank's share, no fp32 copy.
      c.fp32_master_weights = false;
      const auto plain = PredictPeakMemory(m, c, /*gpu=*/true);
      EXPECT_DOUBLE_EQ(plain.weights, 2 * n);
      EXPECT_DOUBLE_EQ(plain.optimizer, 2 * 2 * n / ranks);
      EXPECT_DOUBLE_EQ(p.Peak() - plain.Peak(), (4 + 4) * n / ranks);
    }
  }
  TrainConfig c = Job(4, 2048, "fused");
  c.gpus = 8;
  c.optimizer.shard_state = true;
  c.optimizer.shard_grads = true;
  c.fp32_master_weights = true;
  const auto zero2 = PredictPeakMemory(m, c, /*gpu=*/true);
  EXPECT_DOUBLE_EQ(zero2.weights, 2 * n + 4 * n / 8);
  EXPECT_DOUBLE_EQ(zero2.optimizer, 2 * 4 * n / 8);
  EXPECT_DOUBLE_EQ(zero2.gradients, 2 * n / 8 + 2 * 256.0 * (1 << 20));
  // In fp32 (a CPU's "auto") there is nothing to keep a master of: fp32 weights and moments.
  c.dtype = "auto";
  const auto fp32 = PredictPeakMemory(m, c, /*gpu=*/false);
  EXPECT_DOUBLE_EQ(fp32.weights, 4 * n);
  EXPECT_DOUBLE_EQ(fp32.optimizer, 2 * 4 * n / 8);
}

// LibTorch's AdamW (the eager adamw op) takes an fp32 copy of each bf16 gradient to update the fp32
// masters from (worker/engine/training/optimizer.cc): 4 more bytes per parameter it updates at the step, for
// the rank's share under ZeRO-1; the fused kernel reads the bf16 gradients.
TEST(PeakMemory, EagerAdamWWithFp32MastersHoldsFp32GradientsAtTheStep) {
  const auto m = *PresetLlamaConfig("llama-3.1-8b");
  const double n = 8'030'261'248.0;
  TrainConfig c = Job(4, 2048, "fused");
  c.kernels["adamw"] = KernelSet::kEager;
  c.fp32_master_weights = true;
  EXPECT_DOUBLE_EQ(PredictPeakMemory(m, c, true).gradients, 2 * n + 4 * n);
  c.gpus = 8;
  c.optimizer.shard_state = true;
  const auto zero1 = PredictPeakMemory(m, c, true);
  EXPECT_DOUBLE_EQ(zero1.gradients, 2 * n + 4 * n / 8);
  EXPECT_DOUBLE_EQ(zero1.optimizer, 2 * 4 * n / 8);
  c.fp32_master_weights = false;
  EXPECT_DOUBLE_EQ(PredictPeakMemory(m, c, true).gradients, 2 * n);
}

}  // namespace
}  // namespace ftd::spec

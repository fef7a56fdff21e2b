// TrainConfig validation, kernel sets with per-op overrides, and the learning-rate schedule.
#include "spec/train_config.h"

#include <gtest/gtest.h>

#include <limits>

namespace ftd::spec {
namespace {

TEST(TrainConfig, ValidationNamesTheFieldAndTheFix) {
  TrainConfig c;
  EXPECT_TRUE(c.Validate().ok());
  c.batch_size = 0;
  EXPECT_EQ(c.Validate().message(), "spec.batch_size must be >= 1 (got 0)");
  c = TrainConfig();
  c.optimizer.beta2 = 1.0;
  EXPECT_NE(c.Validate().message().find("spec.optimizer.beta2"), absl::string_view::npos);
  c = TrainConfig();
  c.device = "gpu";
  EXPECT_NE(c.Validate().message().find("spec.device"), absl::string_view::npos);
  c = TrainConfig();
  c.dtype = "fp32";
  c.fp32_master_weights = true;
  EXPECT_NE(c.Validate().message().find("fp32_master_weights"), absl::string_view::npos);
  c = TrainConfig();
  c.model.preset = "tiny";
  c.model.config_path = "/x";
  EXPECT_NE(c.Validate().message().find("spec.model"), absl::string_view::npos);
}

TEST(TrainConfig, GpusIsValidatedAndCheckedAgainstTheHost) {
  TrainConfig c;
  c.gpus = 0;
  EXPECT_EQ(c.Validate().message(), "spec.gpus must be >= 1 (GPUs of one host) (got 0)");
  c.gpus = 4;
  c.device = "cuda:1";
  EXPECT_NE(c.Validate().message().find("spec.device names one GPU, but spec.gpus asks for 4"), absl::string_view::npos);
  c.device = "cpu";
  c.gpus = 9;
  EXPECT_NE(c.Validate().message().find("spec.gpus must be <= 8"), absl::string_view::npos);
  c.gpus = 2;
  ASSERT_TRUE(c.Validate().ok());
  Environment host;
  host.name = "this ftd";
  host.gpus = 1;
  host.host_gpus = 2;
  EXPECT_TRUE(CheckEnvironment(c, host).ok());  // CPU ranks need no GPU
  c.device = "auto";
  EXPECT_TRUE(CheckEnvironment(c, host).ok());
  c.gpus = 3;
  EXPECT_EQ(CheckEnvironment(c, host).message(),
            "spec.gpus asks for 3 GPUs but this ftd has 2: ask for at most 2 (got 3)");
}

TEST(TrainConfig, KernelSetsAndPerOpOverrides) {
  TrainConfig c;
  EXPECT_EQ(c.Kernels().ToString(), "eager");
  EXPECT_FALSE(c.Kernels().any());
  c.kernel_set = KernelSet::kFused;
  EXPECT_TRUE(c.Validate().ok());
  EXPECT_EQ(c.Kernels().ToString(), "fused");
  EXPECT_EQ(c.Kernels().Label(), KernelSet::kFused);
  c.kernels["linear_cross_entropy"] = KernelSet::kEager;
  EXPECT_TRUE(c.Validate().ok());
  EXPECT_FALSE(c.Kernels()[KernelOp::kLinearCrossEntropy]);
  EXPECT_TRUE(c.Kernels()[KernelOp::kCrossEntropy]);
  EXPECT_EQ(c.Kernels().ToString(), "fused (eager: linear_cross_entropy)");
  EXPECT_EQ(c.Kernels().Label(), KernelSet::kMixed);
  // eager by default, one op fused
  TrainConfig e;
  e.kernels["rmsnorm"] = KernelSet::kFused;
  EXPECT_TRUE(e.Validate().ok());
  EXPECT_TRUE(e.Kernels()[KernelOp::kRmsNorm]);
  EXPECT_FALSE(e.Kernels()[KernelOp::kSwiGlu]);
  // an unknown op names itself and lists the valid ones
  e.kernels["layernorm"] = KernelSet::kFused;
  const std::string msg(e.Validate().message());
  EXPECT_NE(msg.find("spec.kernels.layernorm"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rmsnorm, rope, swiglu, cross_entropy, linear_cross_entropy, adamw"), std::string::npos) << msg;
  e.kernels.erase("layernorm");
  // mixed names what overrides make of a run; a spec does not ask for it
  TrainConfig bad;
  bad.kernel_set = KernelSet::kMixed;
  EXPECT_NE(bad.Validate().message().find("spec.kernel_set must be \"eager\", \"fused\" or \"fp8\""),
            absl::string_view::npos);
}

// fp8 is the fused set with FP8 matmuls; `matmul: fp8` puts FP8 matmuls under any other set, and fp8
// is a value of the matmul override only.
TEST(TrainConfig, Fp8SetAndMatmulOverride) {
  TrainConfig c;
  c.kernel_set = KernelSet::kFp8;
  ASSERT_TRUE(c.Validate().ok());
  EXPECT_TRUE(c.Kernels()[KernelOp::kMatmul]);
  EXPECT_TRUE(c.Kernels()[KernelOp::kRmsNorm]);
  EXPECT_TRUE(c.Kernels()[KernelOp::kAdamW]);
  EXPECT_EQ(c.Kernels().ToString(), "fp8");
  EXPECT_EQ(c.Kernels().Label(), KernelSet::kFp8);
  c.kernels["adamw"] = KernelSet::kEager;
  EXPECT_EQ(c.Kernels().ToString(), "fused (eager: adamw), fp8 matmul");
  EXPECT_EQ(c.Kernels().Label(), KernelSet::kMixed);
  c.kernels = {{"matmul", KernelSet::kFused}};  // the bf16 GEMM: the fused set
  EXPECT_EQ(c.Kernels().Label(), KernelSet::kFused);
  EXPECT_FALSE(c.Kernels()[KernelOp::kMatmul]);

  TrainConfig f;
  f.kernel_set = KernelSet::kFused;
  EXPECT_FALSE(f.Kernels()[KernelOp::kMatmul]);  // the fused set keeps bf16 GEMMs
  f.kernels["matmul"] = KernelSet::kFp8;
  ASSERT_TRUE(f.Validate().ok());
  EXPECT_EQ(f.Kernels().Label(), KernelSet::kFp8);
  TrainConfig e;
  e.kernels["matmul"] = KernelSet::kFp8;
  ASSERT_TRUE(e.Validate().ok());
  EXPECT_TRUE(e.Kernels().any());  // FP8 needs a GPU even with every other op eager
  EXPECT_EQ(e.Kernels().ToString(), "eager, fp8 matmul");
  EXPECT_EQ(e.Kernels().Label(), KernelSet::kMixed);

  TrainConfig bad;
  bad.kernels["rmsnorm"] = KernelSet::kFp8;
  EXPECT_EQ(bad.Validate().message(), "spec.kernels.rmsnorm must be \"eager\" or \"fused\" (fp8 applies to matmul only) (got fp8)");
  TrainConfig fp32 = c;
  fp32.kernel_set = KernelSet::kFp8;
  fp32.kernels.clear();
  fp32.dtype = "fp32";
  EXPECT_NE(fp32.Validate().message().find("spec.dtype must be \"bf16\" or \"auto\" with FP8 matmuls"), std::string::npos);
  TrainConfig lora = fp32;
  lora.dtype = "auto";
  lora.lora.enabled = true;
  EXPECT_NE(lora.Validate().message().find("spec.kernels.matmul must not be fp8 in a LoRA job"), std::string::npos);
}

TEST(KernelSet, NamesParseBackAndMixedIsNoSpecValue) {
  for (size_t i = 0; i < kKernelSetNames.size(); ++i) {
    const auto k = static_cast<KernelSet>(i);
    EXPECT_STREQ(KernelSetName(k), kKernelSetNames[i]);
    EXPECT_EQ(ParseKernelSet(kKernelSetNames[i]), k == KernelSet::kMixed ? std::nullopt : std::optional(k));
  }
  EXPECT_EQ(ParseKernelSet("triton"), std::nullopt);
}

TEST(TrainConfig, NumericFieldsHaveStaticUpperBoundsNamingFieldAndLimit) {
  auto msg = [](auto change) {
    TrainConfig c;
    change(c);
    return std::string(c.Validate().message());
  };
  EXPECT_EQ(msg([](TrainConfig& c) { c.batch_size = 1'000'000'000; }), "spec.batch_size must be <= 65536 (got 1000000000)");
  EXPECT_EQ(msg([](TrainConfig& c) { c.seq_len = 2'000'000; }), "spec.seq_len must be <= 1048576 (got 2000000)");
  EXPECT_EQ(msg([](TrainConfig& c) { c.steps = int64_t{1} << 40; }), "spec.steps must be <= 1000000000 (got 1099511627776)");
  EXPECT_NE(msg([](TrainConfig& c) { c.grad_accum_steps = 1 << 20; }).find("spec.grad_accum_steps must be <= 65536"),
            std::string::npos);
  EXPECT_NE(msg([](TrainConfig& c) { c.log_every = 2'000'000'000; }).find("spec.log_every must be <= 1000000000"),
            std::string::npos);
  EXPECT_NE(msg([](TrainConfig& c) { c.schedule.warmup_steps = int64_t{1} << 50; }).find("spec.schedule.warmup_steps must be <="),
            std::string::npos);
  EXPECT_NE(msg([](TrainConfig& c) { c.checkpoint.every_steps = int64_t{1} << 50; }).find("spec.checkpoint.every_steps must be <="),
            std::string::npos);
  EXPECT_NE(msg([](TrainConfig& c) { c.checkpoint.keep_last = 2'000'000'000; }).find("spec.checkpoint.keep_last must be <="),
            std::string::npos);
  EXPECT_EQ(msg([](TrainConfig& c) { c.optimizer.eps = 2; }), "spec.optimizer.eps must be a finite number in (0, 1] (got 2)");
  EXPECT_NE(msg([](TrainConfig& c) { c.optimizer.weight_decay = 1e9; }).find("spec.optimizer.weight_decay"), std::string::npos);
  EXPECT_NE(msg([](TrainConfig& c) { c.optimizer.grad_clip = 1e300; }).find("spec.optimizer.grad_clip"), std::string::npos);
  // the limits themselves pass
  EXPECT_EQ(msg([](TrainConfig& c) { c.batch_size = kMaxBatchSize, c.seq_len = 256, c.steps = kMaxSteps; }), "");
}

TEST(TrainConfig, NonFiniteNumbersAreRefusedEverywhere) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (double bad : {inf, -inf, nan}) {
    auto field = [&](auto change) {
      TrainConfig c;
      change(c);
      const std::string m(c.Validate().message());
      return m.substr(0, m.find(' '));
    };
    EXPECT_EQ(field([&](TrainConfig& c) { c.optimizer.lr = bad; }), "spec.optimizer.lr");
    EXPECT_EQ(field([&](TrainConfig& c) { c.optimizer.eps = bad; }), "spec.optimizer.eps");
    EXPECT_EQ(field([&](TrainConfig& c) { c.optimizer.beta1 = bad; }), "spec.optimizer.beta1");
    EXPECT_EQ(field([&](TrainConfig& c) { c.optimizer.beta2 = bad; }), "spec.optimizer.beta2");
    EXPECT_EQ(field([&](TrainConfig& c) { c.optimizer.weight_decay = bad; }), "spec.optimizer.weight_decay");
    EXPECT_EQ(field([&](TrainConfig& c) { c.optimizer.grad_clip = bad; }), "spec.optimizer.grad_clip");
    EXPECT_EQ(field([&](TrainConfig& c) { c.schedule.min_lr_ratio = bad; }), "spec.schedule.min_lr_ratio");
    EXPECT_EQ(field([&](TrainConfig& c) { c.peak_flops = bad; }), "spec.peak_flops");
    EXPECT_EQ(field([&](TrainConfig& c) { c.lora.enabled = true, c.lora.alpha = bad; }), "spec.lora.alpha");
    EXPECT_EQ(field([&](TrainConfig& c) { c.lora.enabled = true, c.lora.dropout = bad; }), "spec.lora.dropout");
  }
}

// "Fused needs a GPU" and the device's GPU are decided in CheckEnvironment alone, with one message each.
TEST(CheckEnvironment, FusedKernelsAndCudaDevicesNeedAGpu) {
  Environment none{"this ftd", 0, true}, one{"this ftd", 1, true}, unbuilt{"this machine", 1, false};
  TrainConfig fused;
  fused.kernel_set = KernelSet::kFused;
  ASSERT_TRUE(fused.Validate().ok());
  EXPECT_TRUE(CheckEnvironment(fused, one).ok());
  EXPECT_EQ(CheckEnvironment(fused, none).message(),
            "spec.kernel_set uses ftd's fused CUDA kernels (fused), which need a GPU, but this ftd has no GPU: use "
            "\"eager\" in kernel_set and spec.kernels (got fused)");
  auto cpu = fused;
  cpu.device = "cpu";
  EXPECT_NE(CheckEnvironment(cpu, one).message().find("need a GPU, but spec.device is \"cpu\""), absl::string_view::npos);
  auto one_op = TrainConfig();
  one_op.kernels["rmsnorm"] = KernelSet::kFused;
  EXPECT_NE(CheckEnvironment(one_op, none).message().find("(fused (eager: rope, swiglu"), absl::string_view::npos);
  auto lora_only = TrainConfig();
  lora_only.kernels["lora"] = KernelSet::kFused;  // LibTorch ops: runs anywhere
  EXPECT_TRUE(CheckEnvironment(lora_only, none).ok());
  EXPECT_NE(CheckEnvironment(fused, unbuilt).message().find("built without them"), absl::string_view::npos);
  TrainConfig cuda;
  cuda.device = "cuda";
  EXPECT_EQ(CheckEnvironment(cuda, none).message(),
            "spec.device names a GPU but this ftd has no GPU: use \"auto\" or \"cpu\" (got cuda)");
  cuda.device = "cuda:1";
  EXPECT_EQ(CheckEnvironment(cuda, one).message(),
            "spec.device names a GPU a job on this ftd does not see (it sees 1 GPU, as cuda:0): use \"auto\" or "
            "\"cuda\" (got cuda:1)");
  cuda.device = "cuda:0";
  EXPECT_TRUE(CheckEnvironment(cuda, one).ok());
}

// FP8 on the CPU is refused like any fused op; on a GPU older than sm_89 with its own message.
TEST(CheckEnvironment, Fp8NeedsAnFp8Gpu) {
  TrainConfig fp8;
  fp8.kernel_set = KernelSet::kFp8;
  ASSERT_TRUE(fp8.Validate().ok());
  Environment none{"this ftd", 0, true}, a100{"this ftd", 1, true, 80}, h100{"this ftd", 1, true, 90},
      unknown{"this ftd", 1, true, 0};
  EXPECT_EQ(CheckEnvironment(fp8, none).message(),
            "spec.kernel_set uses ftd's fused CUDA kernels (fp8), which need a GPU, but this ftd has no GPU: use "
            "\"eager\" in kernel_set and spec.kernels (got fp8)");
  auto cpu = fp8;
  cpu.device = "cpu";
  EXPECT_NE(CheckEnvironment(cpu, h100).message().find("need a GPU, but spec.device is \"cpu\""), absl::string_view::npos);
  EXPECT_EQ(CheckEnvironment(fp8, a100).message(),
            "spec.kernel_set uses FP8 matmuls, which need a GPU of compute capability 8.9 or newer (Ada, Hopper, "
            "Blackwell), but this ftd's GPU is 8.0: use kernel_set \"fused\" and no matmul override (got fp8)");
  EXPECT_TRUE(CheckEnvironment(fp8, h100).ok());
  EXPECT_TRUE(CheckEnvironment(fp8, unknown).ok());  // the worker checks its own GPU again at start
  TrainConfig over;
  over.kernels["matmul"] = KernelSet::kFp8;
  EXPECT_NE(CheckEnvironment(over, a100).message().find("spec.kernels.matmul uses FP8 matmuls"), absl::string_view::npos);
  EXPECT_NE(CheckEnvironment(over, none).message().find("(eager, fp8 matmul), which need a GPU"), absl::string_view::npos);
  TrainConfig fused;
  fused.kernel_set = KernelSet::kFused;
  EXPECT_TRUE(CheckEnvironment(fused, a100).ok());
}

TEST(Schedule, WarmupThenCosineToTheFloor) {
  OptimizerConfig o;
  o.lr = 1.0;
  ScheduleConfig s;
  s.kind = "cosine";
  s.warmup_steps = 4;
  s.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 0, 20), 0.25);
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 3, 20), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 4, 20), 1.0);   // cosine starts at the peak
  EXPECT_NEAR(LearningRate(o, s, 19, 20), 0.1, 1e-12);  // and ends at the floor on the last step
  double prev = 2;
  for (int i = 4; i < 20; ++i) {
    const double lr = LearningRate(o, s, i, 20);
    EXPECT_LE(lr, prev);
    prev = lr;
  }
  s.kind = "constant";
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 10, 20), 1.0);
}

}  // namespace
}  // namespace ftd::spec

// TrainConfig validation, kernel sets with per-op overrides, and the learning-rate schedule.
#include "spec/train_config.h"

#include <gtest/gtest.h>

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

TEST(TrainConfig, KernelSetsAndPerOpOverrides) {
  TrainConfig c;
  EXPECT_EQ(c.Kernels().ToString(), "eager");
  EXPECT_FALSE(c.Kernels().any());
  c.kernel_set = "fused";
  EXPECT_TRUE(c.Validate().ok());
  EXPECT_EQ(c.Kernels().ToString(), "fused");
  EXPECT_STREQ(c.Kernels().Label(), "fused");
  c.kernels["linear_cross_entropy"] = "eager";
  EXPECT_TRUE(c.Validate().ok());
  EXPECT_FALSE(c.Kernels()[KernelOp::kLinearCrossEntropy]);
  EXPECT_TRUE(c.Kernels()[KernelOp::kCrossEntropy]);
  EXPECT_EQ(c.Kernels().ToString(), "fused (eager: linear_cross_entropy)");
  EXPECT_STREQ(c.Kernels().Label(), "mixed");
  // eager by default, one op fused
  TrainConfig e;
  e.kernels["rmsnorm"] = "fused";
  EXPECT_TRUE(e.Validate().ok());
  EXPECT_TRUE(e.Kernels()[KernelOp::kRmsNorm]);
  EXPECT_FALSE(e.Kernels()[KernelOp::kSwiGlu]);
  // an unknown op names itself and lists the valid ones
  e.kernels["layernorm"] = "fused";
  const std::string msg(e.Validate().message());
  EXPECT_NE(msg.find("spec.kernels.layernorm"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rmsnorm, rope, swiglu, cross_entropy, linear_cross_entropy, adamw"), std::string::npos) << msg;
  e.kernels.erase("layernorm");
  e.kernels["rope"] = "fast";
  EXPECT_NE(e.Validate().message().find("must be \"eager\" or \"fused\""), absl::string_view::npos);
  TrainConfig bad;
  bad.kernel_set = "triton";
  EXPECT_NE(bad.Validate().message().find("spec.kernel_set"), absl::string_view::npos);
  // fused kernels are CUDA-only
  TrainConfig cpu;
  cpu.kernel_set = "fused";
  cpu.device = "cpu";
  EXPECT_NE(cpu.Validate().message().find("need a GPU"), absl::string_view::npos) << cpu.Validate().message();
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

// spec.lora: the adapter scale, target parsing and validation messages.
#include "spec/lora_config.h"

#include <gtest/gtest.h>

#include <cmath>

namespace ftd::spec {
namespace {

TEST(LoraConfig, ScaleIsAlphaOverRankOrOverItsRootWithRslora) {
  LoraConfig c;
  c.enabled = true;
  c.rank = 16;
  EXPECT_DOUBLE_EQ(c.Scale(), 1.0);  // alpha defaults to the rank
  c.alpha = 32;
  EXPECT_DOUBLE_EQ(c.Scale(), 2.0);
  c.use_rslora = true;
  EXPECT_DOUBLE_EQ(c.Scale(), 32.0 / 4.0);
}

TEST(LoraConfig, TargetsTakeShortAndHfNames) {
  EXPECT_EQ(ParseLoraTarget("gate"), LoraTarget::kGate);
  EXPECT_EQ(ParseLoraTarget("down_proj"), LoraTarget::kDown);
  EXPECT_FALSE(ParseLoraTarget("lm_head").has_value());
  EXPECT_FALSE(ParseLoraTarget("Q").has_value());
  LoraConfig c;
  c.target_modules = {"v_proj", "q"};
  const auto on = c.Targets();
  EXPECT_TRUE(on[static_cast<size_t>(LoraTarget::kQ)] && on[static_cast<size_t>(LoraTarget::kV)]);
  EXPECT_FALSE(on[static_cast<size_t>(LoraTarget::kK)] || on[static_cast<size_t>(LoraTarget::kDown)]);
  EXPECT_EQ(LoraConfig().Targets(), (std::array<bool, kNumLoraTargets>{true, true, true, true, true, true, true}));
}

TEST(LoraConfig, ValidationNamesTheFieldAndTheFix) {
  LoraConfig c;
  EXPECT_TRUE(c.Validate().ok());  // disabled: nothing to check
  c.enabled = true;
  EXPECT_TRUE(c.Validate().ok());
  auto msg = [](LoraConfig x) { return std::string(x.Validate().message()); };
  LoraConfig bad = c;
  bad.rank = 4097;
  EXPECT_EQ(msg(bad), "spec.lora.rank must be in [1, 4096] (got 4097)");
  bad = c;
  bad.alpha = std::nan("");
  EXPECT_NE(msg(bad).find("spec.lora.alpha must be a finite number > 0"), std::string::npos);
  bad = c;
  bad.dropout = -0.1;
  EXPECT_NE(msg(bad).find("spec.lora.dropout must be in [0, 1)"), std::string::npos);
  bad = c;
  bad.target_modules = {"embed_tokens"};
  EXPECT_NE(msg(bad).find("spec.lora.target_modules takes only q, k, v, o, gate, up, down (or HF's names: q_proj"),
            std::string::npos)
      << msg(bad);
  bad.target_modules = {"up", "up_proj"};
  EXPECT_NE(msg(bad).find("names each module once"), std::string::npos);
  bad.target_modules = {};
  EXPECT_NE(msg(bad).find("needs at least one of"), std::string::npos);
  bad = c;
  bad.dtype = "fp16";
  EXPECT_NE(msg(bad).find("spec.lora.dtype"), std::string::npos);
  bad = c;
  bad.init = "loftq";
  EXPECT_NE(msg(bad).find("spec.lora.init"), std::string::npos);
}

}  // namespace
}  // namespace ftd::spec

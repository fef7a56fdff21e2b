// The job spec's JSON mapping: defaults, validation, unknown fields.
#include <gtest/gtest.h>

#include "spec/spec.h"

namespace ftd::spec {
namespace {

TEST(Spec, UnsetFieldsTakeDefaultsAndSetOnesAreKept) {
  auto spec = ParseTrainSpecJson(R"({"steps": 7, "optimizer": {"lr": 0.01}, "data": {"shuffle": true}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto c = ToTrainConfig(*spec);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->steps, 7);
  EXPECT_EQ(c->optimizer.lr, 0.01);
  EXPECT_EQ(c->optimizer.beta2, OptimizerConfig().beta2);
  EXPECT_TRUE(c->data.shuffle);
  EXPECT_EQ(c->batch_size, TrainConfig().batch_size);
}

TEST(Spec, SnakeAndCamelCaseBothParse) {
  auto a = ParseTrainSpecJson(R"({"batch_size": 3, "gradAccumSteps": 2})");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->batch_size(), 3);
  EXPECT_EQ(a->grad_accum_steps(), 2);
}

TEST(Spec, UnknownFieldsAndBadTypesAreErrorsNamingThem) {
  auto a = ParseTrainSpecJson(R"({"batchsize": 3})");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("batchsize"), absl::string_view::npos) << a.status();
  auto b = ParseTrainSpecJson(R"({"steps": "many"})");
  EXPECT_NE(b.status().message().find("steps"), absl::string_view::npos) << b.status();
}

TEST(Spec, ExplicitlySetInvalidValuesAreRejected) {
  auto spec = ParseTrainSpecJson(R"({"seq_len": 0})");
  ASSERT_TRUE(spec.ok());
  auto c = ToTrainConfig(*spec);
  EXPECT_EQ(c.status().message(), "spec.seq_len must be >= 1 (got 0)");
}

TEST(Spec, DefaultSpecsAreValidAndRoundTrip) {
  for (bool gpu : {false, true}) {
    auto spec = DefaultTrainSpec(gpu);
    auto c = ToTrainConfig(spec);
    ASSERT_TRUE(c.ok()) << c.status();
    auto again = ParseTrainSpecJson(TrainSpecToJson(spec));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->SerializeAsString(), spec.SerializeAsString());
  }
}

}  // namespace
}  // namespace ftd::spec

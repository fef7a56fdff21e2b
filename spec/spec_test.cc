// The job spec's JSON mapping: defaults, validation, unknown fields.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
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

TEST(Spec, AMistypedFieldIsNamedWithTheFieldMeant) {
  // Protobuf's parser said only "Cannot find field"; the names meant are docs/job-spec.md's.
  const auto hint = [](const std::string& json) { return std::string(ParseTrainSpecJson(json).status().message()); };
  EXPECT_NE(hint(R"({"batchsize": 3})").find("spec.batchsize is not a field of the spec; did you mean \"batch_size\"?"),
            std::string::npos)
      << hint(R"({"batchsize": 3})");
  EXPECT_NE(hint(R"({"optimiser": {"lr": 1e-4}})").find("spec.optimiser is not a field of the spec; did you mean \"optimizer\"?"),
            std::string::npos);
  // A field that lives elsewhere in the spec is named by its path.
  EXPECT_NE(hint(R"({"lr": 1e-4})").find("did you mean \"optimizer.lr\"?"), std::string::npos) << hint(R"({"lr": 1e-4})");
  EXPECT_NE(hint(R"({"optimizer": {"learning_rate": 1e-4}})").find("spec.optimizer.learning_rate"), std::string::npos);
  EXPECT_NE(hint(R"({"data": {"fromat": "chat"}})").find("did you mean \"format\"?"), std::string::npos);
  EXPECT_NE(hint(R"({"seqLne": 3})").find("did you mean \"seq_len\"?"), std::string::npos) << hint(R"({"seqLne": 3})");
  // Nothing close: no guess.
  EXPECT_EQ(hint(R"({"zzzzzzzzzz": 1})").find("did you mean"), std::string::npos);
  // --set goes through the same check.
  ftd::v1::TrainSpec spec;
  const auto st = ApplySetOverride("lr=1e-4", &spec);
  EXPECT_NE(st.message().find("--set lr=1e-4: spec.lr is not a field of the spec; did you mean \"optimizer.lr\"?"),
            absl::string_view::npos)
      << st;
  // Both spellings of real fields, and map keys, are fields.
  EXPECT_TRUE(ParseTrainSpecJson(R"({"gradAccumSteps": 2, "kernels": {"rmsnorm": "eager"}, "lora": {"targetModules": ["q"]}})").ok());
}

TEST(Spec, ASyntaxErrorNamesItsLineAndColumn) {
  auto a = ParseTrainSpecJson("{\n  \"steps\": 7,\n  \"seq_len\": 32,\n}\n");  // trailing comma
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("line 4, column 1"), absl::string_view::npos) << a.status();
  auto b = ParseTrainSpecJson("{\"steps\": 7 \"seq_len\": 3}");  // missing comma
  EXPECT_NE(b.status().message().find("line 1, column 13"), absl::string_view::npos) << b.status();
  auto c = ParseTrainSpecJson("");
  EXPECT_NE(c.status().message().find("line 1, column 1"), absl::string_view::npos) << c.status();
}

TEST(Spec, ANumberOutsideADoublesRangeIsAnErrorNotAnException) {
  // Found by the SubmitJob fuzz target: nlohmann threw out_of_range, which nothing caught.
  auto r = ParseTrainSpecJson(R"({"batch_size": -1e400})");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "spec is not valid JSON: number overflow parsing '-1e400'");
}

TEST(Spec, ExplicitlySetInvalidValuesAreRejected) {
  auto spec = ParseTrainSpecJson(R"({"seq_len": 0})");
  ASSERT_TRUE(spec.ok());
  auto c = ToTrainConfig(*spec);
  EXPECT_EQ(c.status().message(), "spec.seq_len must be >= 1 (got 0)");
}

TEST(Spec, ActivationCheckpointingAllocatorAndFusedProjectionsReachTheConfig) {
  EXPECT_EQ(TrainConfig().activation_checkpointing, ActivationCheckpointing::kNone);
  EXPECT_FALSE(TrainConfig().expandable_segments);
  EXPECT_FALSE(TrainConfig().kernel_tuning.fused_projections);
  for (const auto& [name, want] : {std::pair{"none", ActivationCheckpointing::kNone},
                                   {"selective", ActivationCheckpointing::kSelective},
                                   {"full", ActivationCheckpointing::kFull}}) {
    auto c = ToTrainConfig(*ParseTrainSpecJson(absl::StrCat(R"({"activation_checkpointing": ")", name, R"("})")));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->activation_checkpointing, want);
    EXPECT_STREQ(ActivationCheckpointingName(want), name);
  }
  auto bad = ToTrainConfig(*ParseTrainSpecJson(R"({"activation_checkpointing": "partial"})"));
  EXPECT_EQ(bad.status().message(),
            "spec.activation_checkpointing must be \"none\", \"selective\" (recompute RMSNorm outputs and the SwiGLU "
            "product) or \"full\" (recompute each layer) (got partial)");
  auto on = ToTrainConfig(
      *ParseTrainSpecJson(R"({"expandable_segments": true, "kernel_tuning": {"fused_projections": true}})"));
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->expandable_segments);
  EXPECT_TRUE(on->kernel_tuning.fused_projections);
}

TEST(Spec, FullCheckpointLayersReachTheConfigWithNoneOrSelective) {
  EXPECT_EQ(TrainConfig().full_checkpoint_layers, 0);
  auto c = ToTrainConfig(
      *ParseTrainSpecJson(R"({"activation_checkpointing": "selective", "full_checkpoint_layers": 16})"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->full_checkpoint_layers, 16);
  EXPECT_EQ(c->activation_checkpointing, ActivationCheckpointing::kSelective);
  EXPECT_TRUE(ToTrainConfig(*ParseTrainSpecJson(R"({"full_checkpoint_layers": 40})")).ok());  // all layers
  EXPECT_EQ(ToTrainConfig(*ParseTrainSpecJson(R"({"full_checkpoint_layers": -1})")).status().message(),
            "spec.full_checkpoint_layers must be >= 0: how many of the first decoder layers are rerun in backward "
            "(got -1)");
  EXPECT_EQ(
      ToTrainConfig(*ParseTrainSpecJson(R"({"activation_checkpointing": "full", "full_checkpoint_layers": 4})"))
          .status()
          .message(),
      "spec.full_checkpoint_layers applies with activation_checkpointing \"none\" or \"selective\" (\"full\" already "
      "reruns every layer): drop one of the two");
}

TEST(Spec, OptimizerOverlapReachesTheConfigAndNeedsNoClipping) {
  EXPECT_FALSE(TrainConfig().optimizer.overlap);
  auto on = ToTrainConfig(*ParseTrainSpecJson(R"({"optimizer": {"overlap": true, "grad_clip": 0}})"));
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->optimizer.overlap);
  // The default grad_clip (1.0) clips: refused, naming both fields and the fix.
  auto clipped = ToTrainConfig(*ParseTrainSpecJson(R"({"optimizer": {"overlap": true}})"));
  EXPECT_EQ(clipped.status().message(),
            "spec.optimizer.overlap needs optimizer.grad_clip 0: global-norm clipping needs every gradient before the "
            "first layer is updated; set optimizer.grad_clip 0, or optimizer.overlap false to clip (got grad_clip 1)");
  auto ranks = ToTrainConfig(*ParseTrainSpecJson(R"({"optimizer": {"overlap": true, "grad_clip": 0}, "gpus": 2})"));
  EXPECT_EQ(ranks.status().message(),
            "spec.optimizer.overlap runs on one rank: with spec.gpus > 1 the gradient reduction is what runs inside "
            "backward; set optimizer.overlap false or gpus 1 (got gpus 2)");
}

TEST(Spec, ShardedGradientsReachTheConfigAndNeedTheShardedState) {
  EXPECT_FALSE(TrainConfig().optimizer.shard_grads);
  auto on = ToTrainConfig(
      *ParseTrainSpecJson(R"({"optimizer": {"shard_state": true, "shard_grads": true}, "gpus": 2, "device": "cpu"})"));
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->optimizer.shard_grads);
  auto alone = ToTrainConfig(*ParseTrainSpecJson(R"({"optimizer": {"shard_grads": true}, "gpus": 2, "device": "cpu"})"));
  EXPECT_EQ(alone.status().message(),
            "spec.optimizer.shard_grads needs optimizer.shard_state true: a rank keeps the gradients of the tensors "
            "whose AdamW state it holds (ZeRO-2 shards the gradients as ZeRO-1 shards the state); set "
            "optimizer.shard_state true, or optimizer.shard_grads false (got shard_state false)");
}

TEST(Spec, CudaGraphsReachTheConfigAndRefuseWhatAGraphCannotHold) {
  auto on = ToTrainConfig(*ParseTrainSpecJson(R"({"kernel_tuning": {"cuda_graphs": true}})"));
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->kernel_tuning.cuda_graphs);
  auto accum = ToTrainConfig(*ParseTrainSpecJson(R"({"kernel_tuning": {"cuda_graphs": true}, "grad_accum_steps": 2})"));
  EXPECT_EQ(accum.status().message(),
            "spec.kernel_tuning.cuda_graphs captures one static forward+backward on a CUDA device: it runs without "
            "gradient accumulation, activation checkpointing, optimizer.overlap, several GPUs, FP8 matmuls or LoRA "
            "dropout; set it false or drop the other (got grad_accum_steps > 1)");
  auto cpu = ToTrainConfig(*ParseTrainSpecJson(R"({"kernel_tuning": {"cuda_graphs": true}, "device": "cpu"})"));
  EXPECT_NE(cpu.status().message().find("(got device \"cpu\")"), std::string::npos) << cpu.status();
}

TEST(Spec, KernelTuningReachesTheConfigAndIsBounded) {
  auto c = ToTrainConfig(*ParseTrainSpecJson(R"({"kernel_tuning": {"linear_cross_entropy_chunk_rows": 512}})"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kernel_tuning.LinearCrossEntropyChunkRows(), 512);
  EXPECT_EQ(TrainConfig().kernel_tuning.LinearCrossEntropyChunkRows(), kDefaultLinearCrossEntropyChunkRows);
  auto big = ToTrainConfig(*ParseTrainSpecJson(R"({"kernel_tuning": {"linear_cross_entropy_chunk_rows": 100000}})"));
  EXPECT_EQ(big.status().message(),
            "spec.kernel_tuning.linear_cross_entropy_chunk_rows must be <= 65536 (0 or unset: 2048) (got 100000)");
}

TEST(Spec, ValidateChecksTheWireTheFieldsAndTheEnvironmentInOnePlace) {
  const Environment cpu_ftd{"this ftd", 0, true};
  auto eps = ParseTrainSpecJson(R"({"optimizer": {"eps": "Infinity"}})");
  ASSERT_TRUE(eps.ok()) << eps.status();  // the JSON mapping takes it: Validate must not
  EXPECT_EQ(Validate(*eps, cpu_ftd).status().message(), "spec.optimizer.eps must be a finite number (got inf)");
  auto fused = ParseTrainSpecJson(R"({"kernel_set": "fused"})");
  EXPECT_TRUE(ToTrainConfig(*fused).ok());
  EXPECT_NE(Validate(*fused, cpu_ftd).status().message().find("need a GPU, but this ftd has no GPU"), std::string::npos);
  EXPECT_TRUE(Validate(*fused, Environment{"this machine", 1, true}).ok());
  auto mixed = ParseTrainSpecJson(R"({"kernel_set": "mixed"})");
  EXPECT_NE(ToTrainConfig(*mixed).status().message().find("spec.kernel_set must be \"eager\""), std::string::npos);
  EXPECT_EQ(KernelSetOf(*ParseTrainSpecJson(R"({"kernel_set": "fused", "kernels": {"adamw": "eager"}})")),
            KernelSet::kMixed);
  EXPECT_EQ(KernelSetOf(ftd::v1::TrainSpec()), KernelSet::kEager);
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

// The spec as JSON gives numbers as numbers, 64-bit ones included, as ftctl get --spec does and
// docs/job-spec.md's examples are written (proto3 JSON itself would give "steps": "300").
TEST(Spec, SpecJsonHasNumbersNotStrings) {
  for (bool gpu : {false, true}) {
    const auto j = nlohmann::json::parse(TrainSpecToJson(DefaultTrainSpec(gpu)));
    ASSERT_TRUE(j.contains("steps") && j.contains("seq_len")) << j.dump();
    EXPECT_TRUE(j["steps"].is_number_integer()) << j["steps"];
    EXPECT_EQ(j["steps"].get<int64_t>(), DefaultTrainSpec(gpu).steps());
    EXPECT_TRUE(j["seq_len"].is_number_integer()) << j["seq_len"];
  }
  ftd::v1::TrainSpec s;
  s.set_seed(18446744073709551615ull);  // uint64's largest
  s.mutable_data()->set_eval_every_steps(-1);
  s.mutable_checkpoint()->set_every_steps(int64_t{1} << 53 | 1);  // beyond a double's integers
  const auto j = nlohmann::json::parse(TrainSpecToJson(s));
  EXPECT_TRUE(j["seed"].is_number_unsigned() && j["seed"].get<uint64_t>() == s.seed()) << j.dump();
  EXPECT_EQ(j["data"]["eval_every_steps"].get<int64_t>(), -1);
  EXPECT_EQ(j["checkpoint"]["every_steps"].get<int64_t>(), s.checkpoint().every_steps());
  auto again = ParseTrainSpecJson(TrainSpecToJson(s));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->SerializeAsString(), s.SerializeAsString());
}

TEST(Spec, LoraIsOnWhenPresentEvenEmpty) {
  auto off = ToTrainConfig(*ParseTrainSpecJson(R"({"steps": 2})"));
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->lora.enabled);
  auto on = ToTrainConfig(*ParseTrainSpecJson(R"({"lora": {}})"));
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->lora.enabled);
  EXPECT_EQ(on->lora.rank, LoraConfig().rank);
  EXPECT_EQ(on->lora.target_modules.size(), kNumLoraTargets);
  auto set = ToTrainConfig(*ParseTrainSpecJson(
      R"({"lora": {"rank": 16, "alpha": 32, "dropout": 0.05, "targetModules": ["q", "v_proj"], "use_rslora": true,
          "dtype": "bf16", "merge": true, "init": "gaussian", "adapter_path": "/a"}})"));
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->lora.rank, 16);
  EXPECT_EQ(set->lora.Alpha(), 32);
  EXPECT_EQ(set->lora.dropout, 0.05);
  EXPECT_EQ(set->lora.target_modules, (std::vector<std::string>{"q", "v_proj"}));
  EXPECT_TRUE(set->lora.use_rslora && set->lora.merge);
  EXPECT_EQ(set->lora.dtype, "bf16");
  EXPECT_EQ(set->lora.init, "gaussian");
  EXPECT_EQ(set->lora.adapter_path, "/a");
  auto bad = ToTrainConfig(*ParseTrainSpecJson(R"({"lora": {"rank": -1}})"));
  EXPECT_EQ(bad.status().message(), "spec.lora.rank must be in [1, 4096] (got -1)");
}

TEST(Spec, SetOverrideReplacesTheTargetList) {
  auto spec = ParseTrainSpecJson(R"({"lora": {"target_modules": ["q", "k"]}})");
  ASSERT_TRUE(spec.ok());
  ASSERT_TRUE(ApplySetOverride(R"(lora.target_modules=["down"])", &*spec).ok());
  ASSERT_TRUE(ApplySetOverride("lora.rank=4", &*spec).ok());
  auto c = ToTrainConfig(*spec);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->lora.target_modules, (std::vector<std::string>{"down"}));
  EXPECT_EQ(c->lora.rank, 4);
}

}  // namespace
}  // namespace ftd::spec

// ZeRO's assignment of tensors to ranks (ShardOwners) at the 8B's real shapes, on the model's own
// trainable tensors built on the meta device (shapes only, no memory): each rank of 8 holds 1/8 of
// the elements to within 0.01 GiB of bf16 (docs/distributed.md), and the peak-memory predictor, which
// charges each rank 1/N of the optimizer state and gradients, agrees with the largest rank's share.
// On the tiny test model any assignment looks balanced; at these shapes a wrong order puts about
// 0.17 of the elements on one rank.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "spec/peak_memory.h"
#include "worker/engine/distributed/data_parallel.h"
#include "worker/engine/model/model.h"

namespace ftd::engine {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::vector<torch::Tensor> Trainable8B() {
  const auto config = spec::PresetLlamaConfig("llama-3.1-8b");
  EXPECT_TRUE(config.ok()) << config.status();
  auto model = LlamaModel::Create(*config, torch::Device(torch::kMeta), torch::kBFloat16, /*seed=*/1);
  EXPECT_TRUE(model.ok()) << model.status();
  std::vector<torch::Tensor> out;
  for (const auto& [name, t] : (*model)->trainable_parameters()) out.push_back(t);
  return out;
}

// Elements per rank.
std::vector<int64_t> Loads(const std::vector<torch::Tensor>& params, const std::vector<int>& owner, int world) {
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  EXPECT_EQ(owner.size(), params.size());
  for (size_t k = 0; k < params.size() && k < owner.size(); ++k) {
    EXPECT_GE(owner[k], 0);
    EXPECT_LT(owner[k], world);
    load[static_cast<size_t>(owner[k])] += params[k].numel();
  }
  return load;
}

TEST(ShardOwners, EachOfEightRanksHoldsAnEighthOfThe8B) {
  const auto params = Trainable8B();
  // HF's layout: the embedding, 9 tensors per layer for 32 layers, the final norm and lm_head.
  ASSERT_EQ(params.size(), 291u);
  const int64_t total = std::accumulate(params.begin(), params.end(), int64_t{0},
                                        [](int64_t s, const torch::Tensor& t) { return s + t.numel(); });
  ASSERT_EQ(total, 8'030'261'248);  // docs/testing.md: the 8B preset's parameter count
  for (const int world : {8, 2, 3}) {
    SCOPED_TRACE(world);
    const auto owner = ShardOwners(params, world);
    const auto load = Loads(params, owner, world);
    EXPECT_EQ(std::accumulate(load.begin(), load.end(), int64_t{0}), total);  // every tensor has one owner
    const double even = static_cast<double>(total) / world;
    // Within 0.01 GiB of bf16 (2 bytes an element) of an even split, both ways.
    const double slack = 0.01 * kGiB / 2;
    EXPECT_LE(*std::max_element(load.begin(), load.end()), even + slack);
    EXPECT_GE(*std::min_element(load.begin(), load.end()), even - slack);
    EXPECT_EQ(ShardOwners(params, world), owner);  // every rank computes the same assignment
  }
}

// The predictor's per-rank optimizer state, masters and gradients against what the largest rank
// of the real assignment holds, at 8 ranks: AdamW's two moments (bf16, or fp32 with fp32 master
// weights), the fp32 masters, and under ZeRO-2 the owned bf16 gradients (plus at most two of the reducer's
// buckets in flight, docs/distributed.md).
TEST(ShardOwners, ThePeakPredictorExpectsTheLargestRanksShareAt8Ranks) {
  const auto params = Trainable8B();
  const auto load = Loads(params, ShardOwners(params, 8), 8);
  const double largest = static_cast<double>(*std::max_element(load.begin(), load.end()));
  const auto config = *spec::PresetLlamaConfig("llama-3.1-8b");
  spec::TrainConfig c;
  c.batch_size = 4;
  c.seq_len = 2048;
  c.kernel_set = *spec::ParseKernelSet("fused");
  c.dtype = "bf16";
  c.gpus = 8;
  c.optimizer.shard_state = true;
  c.optimizer.shard_grads = true;
  const double tolerance = 0.01 * kGiB;
  {
    SCOPED_TRACE("bf16 moments");
    const auto p = spec::PredictPeakMemory(config, c, /*gpu=*/true);
    EXPECT_NEAR(p.optimizer, 2 * 2 * largest, 2 * tolerance) << p.ToString();
    EXPECT_NEAR(p.gradients, 2 * largest + 2.0 * GradReducer::kBucketBytes, tolerance) << p.ToString();
  }
  {
    SCOPED_TRACE("fp32 master weights and moments");
    c.fp32_master_weights = true;
    const auto p = spec::PredictPeakMemory(config, c, /*gpu=*/true);
    EXPECT_NEAR(p.optimizer, 2 * 4 * largest, 4 * tolerance) << p.ToString();
    EXPECT_NEAR(p.weights - 2.0 * 8'030'261'248, 4 * largest, 2 * tolerance) << p.ToString();
  }
}

}  // namespace
}  // namespace ftd::engine

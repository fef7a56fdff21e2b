#include "server/policy/memory_fit.h"

#include <gtest/gtest.h>

#include <string>

#include "spec/peak_memory.h"

namespace ftd::server {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

spec::TrainConfig Job(int32_t batch, int32_t seq) {
  spec::TrainConfig c;
  c.device = "cpu";
  c.batch_size = batch;
  c.seq_len = seq;
  return c;
}

spec::LlamaConfig Tiny() { return *spec::PresetLlamaConfig("tiny"); }

bool StartsWith(absl::string_view s, absl::string_view p) { return s.substr(0, p.size()) == p; }

TEST(MemoryFit, ASmallJobFitsAndAnUnknownCapacityBoundsNothing) {
  EXPECT_TRUE(CheckMemoryFit(Tiny(), Job(4, 32), false, {16 * kGiB, 0}).ok());
  EXPECT_TRUE(CheckMemoryFit(Tiny(), Job(20000, 2048), false, {0, 0}).ok());
}

// The two jobs that once passed submission and died of std::bad_alloc or the OOM killer.
TEST(MemoryFit, TooLargeABatchIsRefusedNamingTheLargestThatFits) {
  const MachineMemory m{16 * kGiB, 0};
  for (const auto& c : {Job(20000, 2048), Job(1'000'000'000, 128)}) {
    const absl::Status st = CheckMemoryFit(Tiny(), c, false, m);
    ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_TRUE(StartsWith(st.message(), "spec.batch_size: ")) << st;
    EXPECT_NE(st.message().find("may use 16.0 GiB of host memory"), std::string::npos) << st;
    // The batch size it names fits, and one more does not.
    const std::string msg(st.message());
    const auto at = msg.find("at most ") + 8;
    const int32_t b = std::stoi(std::string(msg.substr(at, msg.find(' ', at) - at)));
    ASSERT_GT(b, 0);
    EXPECT_TRUE(CheckMemoryFit(Tiny(), Job(b, c.seq_len), false, m).ok());
    EXPECT_FALSE(CheckMemoryFit(Tiny(), Job(b + 1, c.seq_len), false, m).ok());
  }
}

TEST(MemoryFit, NamesSeqLenWhenOneSequenceDoesNotFitAndTheModelWhenNothingDoes) {
  auto st = CheckMemoryFit(Tiny(), Job(1, 1 << 30), false, {16 * kGiB, 0});
  EXPECT_TRUE(StartsWith(st.message(), "spec.seq_len: ")) << st;
  const spec::LlamaConfig big = *spec::PresetLlamaConfig("llama-3.1-8b");
  st = CheckMemoryFit(big, Job(1, 16), false, {16 * kGiB, 0});
  EXPECT_TRUE(StartsWith(st.message(), "spec.model: ")) << st;
  EXPECT_NE(st.message().find("LoRA"), std::string::npos) << st;
}

TEST(MemoryFit, AGpuJobIsBoundByTheGpusMemory) {
  const spec::LlamaConfig big = *spec::PresetLlamaConfig("llama-3.1-8b");
  spec::TrainConfig c = Job(1, 512);
  c.device = "auto";
  c.lora.enabled = true;
  const double need = spec::PredictPeakMemory(big, c, true).Peak();
  EXPECT_TRUE(CheckMemoryFit(big, c, true, {1 * kGiB, 80 * kGiB}).ok()) << "host memory does not bound a GPU job";
  const auto st = CheckMemoryFit(big, c, true, {1 * kGiB, static_cast<int64_t>(need) - 1});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("a GPU here has"), std::string::npos) << st;
}

TEST(MemoryFit, ModelShapeFollowsTheWorkersDefaults) {
  spec::TrainConfig c = Job(1, 1);
  EXPECT_EQ(ModelShape(c, false)->NumParameters(), Tiny().NumParameters());
  EXPECT_EQ(ModelShape(c, true)->hidden_size, 4096);
  c.model.config_path = "/nonexistent/config.json";
  EXPECT_FALSE(ModelShape(c, false).has_value());
  c.model.config_path = "/dev/null";  // not a regular file: never read by the daemon
  EXPECT_FALSE(ModelShape(c, false).has_value());
}

TEST(MemoryFit, HostMemoryIsRead) { EXPECT_GT(HostMemoryBytes(), 64 * (int64_t{1} << 20)); }


// The bound at submit takes the job's own options: ZeRO on 8 GPUs fits the 8B where one GPU's worth
// of state does not, and under non-default options (fp32 masters, ZeRO-1, full activation
// checkpointing) the batch size named fits and one more does not.
TEST(MemoryFit, TheJobsOptionsDecideWhatFits) {
  const spec::LlamaConfig big = *spec::PresetLlamaConfig("llama-3.1-8b");
  const MachineMemory m{1 * kGiB, 40 * kGiB};
  spec::TrainConfig c = Job(1, 512);
  c.device = "auto";
  c.gpus = 8;
  c.kernel_set = *spec::ParseKernelSet("fused");
  EXPECT_EQ(CheckMemoryFit(big, c, true, m).code(), absl::StatusCode::kInvalidArgument);  // 60 GiB unsharded
  c.optimizer.shard_state = true;
  c.optimizer.shard_grads = true;
  EXPECT_TRUE(CheckMemoryFit(big, c, true, m).ok()) << spec::PredictPeakMemory(big, c, true).ToString();

  spec::TrainConfig o = Job(64, 2048);
  o.device = "auto";
  o.gpus = 2;
  o.kernel_set = *spec::ParseKernelSet("fused");
  o.fp32_master_weights = true;
  o.optimizer.shard_state = true;
  o.activation_checkpointing = spec::ActivationCheckpointing::kFull;
  const MachineMemory g{1 * kGiB, 80 * kGiB};
  const absl::Status st = CheckMemoryFit(big, o, true, g);
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  ASSERT_TRUE(StartsWith(st.message(), "spec.batch_size: ")) << st;
  const std::string msg(st.message());
  const auto at = msg.find("at most ") + 8;
  const int32_t b = std::stoi(std::string(msg.substr(at, msg.find(' ', at) - at)));
  ASSERT_GT(b, 0);
  o.batch_size = b;
  EXPECT_TRUE(CheckMemoryFit(big, o, true, g).ok());
  o.batch_size = b + 1;
  EXPECT_FALSE(CheckMemoryFit(big, o, true, g).ok());
  // Without the sharding, fewer fit; without the masters, more.
  spec::TrainConfig unsharded = o;
  unsharded.optimizer.shard_state = false;
  unsharded.batch_size = b;
  EXPECT_FALSE(CheckMemoryFit(big, unsharded, true, g).ok());
}

}  // namespace
}  // namespace ftd::server

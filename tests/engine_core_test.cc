// Unit tests of the engine's torch-free parts: safetensors, token data, configs, LR schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "worker/engine/gpu_monitor.h"
#include "worker/engine/fs_util.h"
#include "worker/engine/llama_config.h"
#include "worker/engine/safetensors.h"
#include "worker/engine/token_data.h"
#include "worker/engine/train_config.h"

namespace ftd::engine {
namespace {

namespace fs = std::filesystem;

fs::path TempDir() {
  fs::path d = fs::temp_directory_path() / ("ftd-test-" + std::to_string(::getpid()) + "-" +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  const fs::path dir = TempDir();
  std::mt19937 rng(std::random_device{}());
  std::vector<float> a(3 * 5);
  for (auto& v : a) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<uint16_t> b = {1, 2, 3, 65535};
  ASSERT_TRUE(WriteSafetensors((dir / "x.safetensors").string(),
                               {{"a.weight", DType::kF32, {3, 5}, a.data()}, {"b", DType::kBF16, {4}, b.data()}},
                               {{"format", "pt"}})
                  .ok());
  auto f = SafetensorsFile::Open((dir / "x.safetensors").string());
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->tensors().size(), 2u);
  const TensorInfo* ta = (*f)->Find("a.weight");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(std::memcmp((*f)->data(*ta), a.data(), a.size() * 4), 0);
  const TensorInfo* tb = (*f)->Find("b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->dtype, DType::kBF16);
  EXPECT_EQ(std::memcmp((*f)->data(*tb), b.data(), 8), 0);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
}

std::string Header(const std::string& json) {
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out + json;
}

absl::Status OpenBytes(const fs::path& p, const std::string& bytes) {
  { std::ofstream(p, std::ios::binary) << bytes; }
  return SafetensorsFile::Open(p.string()).status();
}

TEST(Safetensors, RejectsCorruptFilesNamingTheTensor) {
  const fs::path dir = TempDir();
  const fs::path p = dir / "bad.safetensors";
  std::string data(16, 'x');
  // Truncated: the tensor's data runs past the end of the file.
  auto s = OpenBytes(p, Header(R"({"w":{"dtype":"F32","shape":[2,4],"data_offsets":[0,32]}})") + data);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("\"w\""), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("truncated"), absl::string_view::npos) << s;
  // Shape and offsets disagree.
  s = OpenBytes(p, Header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})") + data);
  EXPECT_NE(s.message().find("\"w\""), absl::string_view::npos) << s;
  // Unknown dtype.
  s = OpenBytes(p, Header(R"({"emb":{"dtype":"F7","shape":[4],"data_offsets":[0,16]}})") + data);
  EXPECT_NE(s.message().find("\"emb\""), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("F7"), absl::string_view::npos) << s;
  // Overlapping tensors.
  s = OpenBytes(p, Header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})") + data);
  EXPECT_NE(s.message().find("overlaps"), absl::string_view::npos) << s;
  // Header length beyond the file, and a file shorter than the length field.
  s = OpenBytes(p, Header(R"({"a":1})").substr(0, 10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  s = OpenBytes(p, "abc");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  // Not JSON.
  s = OpenBytes(p, Header("{nope") + data);
  EXPECT_NE(s.message().find("JSON"), absl::string_view::npos) << s;
}

TEST(Safetensors, ShardedIndexIsFollowed) {
  const fs::path dir = TempDir();
  float x = 1.5f, y = -2.0f;
  ASSERT_TRUE(WriteSafetensors((dir / "s1.safetensors").string(), {{"x", DType::kF32, {1}, &x}}).ok());
  ASSERT_TRUE(WriteSafetensors((dir / "s2.safetensors").string(), {{"y", DType::kF32, {1}, &y}}).ok());
  ASSERT_TRUE(WriteFileSynced((dir / "model.safetensors.index.json").string(),
                              R"({"metadata":{},"weight_map":{"x":"s1.safetensors","y":"s2.safetensors"}})")
                  .ok());
  auto set = SafetensorsSet::OpenDir(dir.string());
  ASSERT_TRUE(set.ok()) << set.status();
  auto fy = set->Find("y");
  ASSERT_TRUE(fy.ok());
  float got;
  std::memcpy(&got, fy->first->data(*fy->second), 4);
  EXPECT_EQ(got, y);
  auto missing = set->Find("z");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("\"z\""), absl::string_view::npos);
}

TEST(TokenData, WindowsInFileOrderWithoutShuffle) {
  const fs::path dir = TempDir();
  std::vector<uint32_t> ids(100);
  for (uint32_t i = 0; i < ids.size(); ++i) ids[i] = i;
  { std::ofstream(dir / "t.bin", std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), 400); }
  DataConfig cfg;
  cfg.path = (dir / "t.bin").string();
  cfg.token_dtype = "uint32";
  auto d = TokenData::Open(cfg, /*seq_len=*/9, /*batch=*/2, /*vocab=*/1000);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->num_windows(), 10);
  EXPECT_EQ((*d)->batches_per_epoch(), 5);
  std::vector<int64_t> b;
  ASSERT_TRUE((*d)->Batch(1, &b).ok());  // windows 2 and 3
  ASSERT_EQ(b.size(), 20u);
  EXPECT_EQ(b[0], 20);
  EXPECT_EQ(b[10], 30);
  EXPECT_EQ(b[19], 39);
  ASSERT_TRUE((*d)->Batch(6, &b).ok());  // epoch 1 wraps to windows 2, 3
  EXPECT_EQ(b[0], 20);
}

TEST(TokenData, ShuffleIsASeededPermutation) {
  DataConfig cfg;  // the embedded dataset
  cfg.shuffle = true;
  cfg.seed = 7;
  auto d1 = TokenData::Open(cfg, 15, 4, 64);
  auto d2 = TokenData::Open(cfg, 15, 4, 64);
  cfg.seed = 8;
  auto d3 = TokenData::Open(cfg, 15, 4, 64);
  ASSERT_TRUE(d1.ok() && d2.ok() && d3.ok());
  std::vector<int64_t> a, b, c;
  ASSERT_TRUE((*d1)->Batch(3, &a).ok());
  ASSERT_TRUE((*d2)->Batch(3, &b).ok());
  ASSERT_TRUE((*d3)->Batch(3, &c).ok());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(TokenData, RejectsIdsOutsideTheVocabAndShortFiles) {
  const fs::path dir = TempDir();
  std::vector<uint16_t> ids(64, 3);
  ids[40] = 500;
  { std::ofstream(dir / "t.bin", std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), 128); }
  DataConfig cfg;
  cfg.path = (dir / "t.bin").string();
  auto d = TokenData::Open(cfg, 7, 2, 100);
  ASSERT_TRUE(d.ok());
  std::vector<int64_t> b;
  EXPECT_TRUE((*d)->Batch(0, &b).ok());
  auto s = (*d)->Batch(2, &b);  // windows 4, 5 hold token 40
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("vocab_size 100"), absl::string_view::npos) << s;
  auto small = TokenData::Open(cfg, 63, 2, 100);
  EXPECT_NE(small.status().message().find("batch_size"), absl::string_view::npos) << small.status();
  cfg.path = (dir / "missing.bin").string();
  EXPECT_NE(TokenData::Open(cfg, 7, 2, 100).status().message().find("spec.data.path"), absl::string_view::npos);
}

TEST(TokenData, EmbeddedArithmeticIsWellFormed) {
  auto ids = GenerateArithmetic(1, 4000);
  std::vector<int64_t> wide(ids.begin(), ids.end());
  std::string text = DecodeArithmetic(wide);
  // Every complete statement a(+|-)b=r; is arithmetically right.
  size_t pos = text.find(';') + 1, checked = 0;
  for (size_t end; (end = text.find(';', pos)) != std::string::npos; pos = end + 1, ++checked) {
    std::string st = text.substr(pos, end - pos);
    const size_t eq = st.find('='), op = st.find_first_of("+-");
    ASSERT_NE(eq, std::string::npos) << st;
    const long a = std::stol(st.substr(0, op)), b = std::stol(st.substr(op + 1, eq - op - 1));
    const long r = std::stol(st.substr(eq + 1));
    EXPECT_EQ(st[op] == '+' ? a + b : a - b, r) << st;
  }
  EXPECT_GT(checked, 200u);
}

TEST(LlamaConfig, ParsesHfConfigsBothRopeStyles) {
  auto a = ParseLlamaConfig(R"({"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":12,
    "num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,"rope_theta":500000.0,
    "rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
    "original_max_position_embeddings":8192}})");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->head_dim, 4);
  EXPECT_EQ(a->rope_scaling.type, "llama3");
  EXPECT_EQ(a->rope_theta, 500000.0);
  auto b = ParseLlamaConfig(R"({"vocab_size":10,"hidden_size":8,"intermediate_size":12,"num_hidden_layers":1,
    "num_attention_heads":2,"rope_parameters":{"rope_type":"default","rope_theta":1234.0}})");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->rope_theta, 1234.0);
  EXPECT_TRUE(b->rope_scaling.type.empty());
  EXPECT_EQ(b->num_key_value_heads, 2);
  // Round trip through our own writer.
  auto c = ParseLlamaConfig(a->ToJson());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->NumParameters(), a->NumParameters());
}

TEST(LlamaConfig, RejectsBadConfigsNamingTheField) {
  auto gqa = ParseLlamaConfig(R"({"vocab_size":10,"hidden_size":12,"intermediate_size":12,"num_hidden_layers":1,
    "num_attention_heads":3,"num_key_value_heads":2})");
  EXPECT_NE(gqa.status().message().find("num_key_value_heads"), absl::string_view::npos) << gqa.status();
  auto missing = ParseLlamaConfig(R"({"hidden_size":12})");
  EXPECT_NE(missing.status().message().find("vocab_size"), absl::string_view::npos) << missing.status();
  auto rope = ParseLlamaConfig(R"({"vocab_size":10,"hidden_size":8,"intermediate_size":12,"num_hidden_layers":1,
    "num_attention_heads":2,"rope_scaling":{"rope_type":"yarn","factor":2.0}})");
  EXPECT_NE(rope.status().message().find("yarn"), absl::string_view::npos) << rope.status();
}

TEST(LlamaConfig, EightBPresetHasEightBillionParameters) {
  auto c = PresetLlamaConfig("llama-3.1-8b");
  ASSERT_TRUE(c.ok());
  // Meta-Llama-3.1-8B: 8,030,261,248 parameters.
  EXPECT_EQ(c->NumParameters(), 8030261248);
}

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

TEST(GpuMonitor, MissingNvmlIsUnavailableWithAReason) {
  auto m = GpuMonitor::Open("0000:00:00.0", "libnvidia-ml-that-does-not-exist.so.1");
  EXPECT_FALSE(m->available());
  EXPECT_NE(m->reason().find("NVML not loaded"), std::string::npos) << m->reason();
  EXPECT_FALSE(m->Read().ok);
}

TEST(EnergyWindow, PerStepFiguresSpanWholeStepsOverAtLeastTheWindow) {
  EnergyWindow w(1.0);
  w.Start(/*t=*/0.0, /*energy=*/100.0, /*tokens=*/0, /*step=*/0);
  w.AddStep(0.5, 150.0, 1000, 1);  // shorter than the window: measured from the start
  auto s = w.Current();
  EXPECT_DOUBLE_EQ(s.energy_total_j, 50.0);
  EXPECT_DOUBLE_EQ(s.step_energy_j, 50.0);
  EXPECT_DOUBLE_EQ(s.joules_per_token, 0.05);
  EXPECT_DOUBLE_EQ(s.power_w, 100.0);
  w.AddStep(1.0, 200.0, 2000, 2);
  EXPECT_DOUBLE_EQ(w.Current().step_energy_j, 50.0);
  w.AddStep(1.5, 300.0, 3000, 3);  // the newest steps spanning >= 1 s: from t=0.5 to t=1.5
  s = w.Current();
  EXPECT_DOUBLE_EQ(s.energy_total_j, 200.0);
  EXPECT_DOUBLE_EQ(s.step_energy_j, 75.0);
  EXPECT_DOUBLE_EQ(s.joules_per_token, 0.075);
  EXPECT_DOUBLE_EQ(s.power_w, 150.0);
  w.AddStep(3.0, 450.0, 4000, 4);  // one long step is a window of its own
  s = w.Current();
  EXPECT_DOUBLE_EQ(s.step_energy_j, 150.0);
  EXPECT_DOUBLE_EQ(s.power_w, 100.0);
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
}  // namespace ftd::engine

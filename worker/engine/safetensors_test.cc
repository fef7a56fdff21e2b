// The safetensors reader and writer: round trip, corrupt files refused naming the tensor, sharded
// indexes.
#include "worker/engine/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

#include "worker/engine/fs_util.h"
#include "worker/engine/test_tmpdir.h"

namespace ftd::engine {
namespace {

namespace fs = std::filesystem;

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

}  // namespace
}  // namespace ftd::engine

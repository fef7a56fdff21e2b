// Token data: windows in file order, the seeded shuffle, bad files refused, the embedded dataset.
#include "worker/engine/token_data.h"

#include <gtest/gtest.h>

#include <fstream>

#include "worker/engine/test_tmpdir.h"

namespace ftd::engine {
namespace {

namespace fs = std::filesystem;

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

}  // namespace
}  // namespace ftd::engine

// Token data: windows in file order, the seeded shuffle, bad files refused, the embedded dataset.
#include "worker/engine/core/token_data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>

#include "worker/engine/core/fs_util.h"
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
  MicroBatch b;
  (*d)->Batch(1, &b);  // windows 2 and 3
  ASSERT_EQ(b.input_ids.size(), 18u);
  EXPECT_EQ(b.input_ids[0], 20);
  EXPECT_EQ(b.labels[0], 21);
  EXPECT_EQ(b.input_ids[9], 30);
  EXPECT_EQ(b.labels[17], 39);
  EXPECT_EQ(b.positions[17], 8);
  EXPECT_FALSE(b.multi_document);
  EXPECT_EQ(b.loss_tokens, 18);
  (*d)->Batch(6, &b);  // epoch 1 wraps to windows 2, 3
  EXPECT_EQ(b.input_ids[0], 20);
  // Two data-parallel ranks split micro-batch 1: rank 0 takes window 2, rank 1 window 3.
  (*d)->Batch(1, &b, /*part=*/0, /*parts=*/2);
  ASSERT_EQ(b.rows, 1);
  EXPECT_EQ(b.input_ids[0], 20);
  (*d)->Batch(1, &b, /*part=*/1, /*parts=*/2);
  ASSERT_EQ(b.rows, 1);
  EXPECT_EQ(b.input_ids[0], 30);
  EXPECT_EQ(b.loss_tokens, 9);
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
  MicroBatch a, b, c;
  (*d1)->Batch(3, &a);
  (*d2)->Batch(3, &b);
  (*d3)->Batch(3, &c);
  EXPECT_EQ(a.input_ids, b.input_ids);
  EXPECT_NE(a.input_ids, c.input_ids);
}

TEST(TokenData, RejectsIdsOutsideTheVocabAndShortFiles) {
  const fs::path dir = TempDir();
  std::vector<uint16_t> ids(64, 3);
  ids[40] = 500;
  { std::ofstream(dir / "t.bin", std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), 128); }
  DataConfig cfg;
  cfg.path = (dir / "t.bin").string();
  // Refused at open, before any batch, with the vocab size. Unconfined (the single-user default) the
  // message names the id and where it is.
  auto d = TokenData::Open(cfg, 7, 2, 100);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("not a valid token file for this model: token 40 is id 500, outside the "
                                      "model's vocab_size 100"), absl::string_view::npos) << d.status();
  // Under the caller's own (writable) root too.
  ASSERT_TRUE(ConfineOpens({{dir.string(), true}}).ok());
  d = TokenData::Open(cfg, 7, 2, 100);
  EXPECT_NE(d.status().message().find("token 40 is id 500,"), absl::string_view::npos) << d.status();
  // Under a read-only root the file may be another user's: neither the id nor where it is.
  ASSERT_TRUE(ConfineOpens({{dir.string(), false}}).ok());
  d = TokenData::Open(cfg, 7, 2, 100);
  ASSERT_TRUE(ConfineOpens({}).ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("not a valid token file for this model: it holds ids outside the model's "
                                      "vocab_size 100"), absl::string_view::npos) << d.status();
  // The file's name is quoted and holds a random temporary directory: look at the rest.
  std::string rest(d.status().message());
  if (const size_t at = rest.find(cfg.path); at != std::string::npos) rest.erase(at, cfg.path.size());
  EXPECT_EQ(rest.find("500"), std::string::npos) << d.status();
  EXPECT_EQ(rest.find("40"), std::string::npos) << d.status();
  // A tokenized corpus names the example too.
  data::Corpus c;
  c.ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  c.loss = std::vector<uint8_t>(12, 1);
  c.docs = {0, 5, 8, 12};
  auto corpus = TokenData::FromCorpus(c, cfg, 3, 1, 7);
  EXPECT_NE(corpus.status().message().find("token 6 (in example 2) is id 7, outside the model's vocab_size 7"),
            absl::string_view::npos) << corpus.status();
  EXPECT_TRUE(TokenData::Open(cfg, 7, 2, 501).ok());
  auto small = TokenData::Open(cfg, 63, 2, 501);
  EXPECT_NE(small.status().message().find("batch_size"), absl::string_view::npos) << small.status();
  cfg.path = (dir / "missing.bin").string();
  EXPECT_NE(TokenData::Open(cfg, 7, 2, 100).status().message().find("spec.data.path"), absl::string_view::npos);
}

TEST(PreparedCorpus, RoundTripsAndRefusesInconsistentEntries) {
  const fs::path dir = TempDir();
  data::Corpus c;
  c.ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  c.loss = {0, 0, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1};
  c.docs = {0, 5, 8, 12};
  c.lines = 3;
  ASSERT_TRUE(data::WriteCorpus((dir / "entry").string(), c).ok());
  auto read = data::ReadCorpus((dir / "entry").string());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->ids, c.ids);
  EXPECT_EQ(read->loss, c.loss);
  EXPECT_EQ(read->docs, c.docs);
  EXPECT_EQ(read->lines, 3u);
  std::ofstream(dir / "entry" / "loss.u8", std::ios::binary).write("\1\1", 2);  // fewer flags than ids
  EXPECT_EQ(data::ReadCorpus((dir / "entry").string()).status().code(), absl::StatusCode::kDataLoss);
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

// 60 documents of 5..40 tokens; every token of document d is id d + 1, so a row's ids name its documents.
data::Corpus NumberedDocuments() {
  data::Corpus c;
  for (uint32_t d = 0; d < 60; ++d) {
    const uint32_t len = 5 + (d * 7) % 36;
    for (uint32_t i = 0; i < len; ++i) {
      c.ids.push_back(d + 1);
      c.loss.push_back(1);
    }
    c.docs.push_back(c.ids.size());
  }
  return c;
}

// The documents whose tokens appear in any row of `d` (inputs, and the last label of each row).
std::set<int64_t> DocumentsIn(TokenData& d) {
  MicroBatch b;
  d.Rows(0, d.num_rows(), &b);
  std::set<int64_t> docs(b.input_ids.begin(), b.input_ids.end());
  for (int64_t l : b.labels) {
    if (l != kLabelIgnored) docs.insert(l);
  }
  return docs;
}

TEST(TokenData, PackedHeldOutDataIsSplitByDocumentBeforePacking) {
  DataConfig cfg;
  cfg.eval_fraction = 0.3;
  cfg.seed = 11;
  auto train = TokenData::FromCorpus(NumberedDocuments(), cfg, /*seq_len=*/15, /*batch=*/2, /*vocab=*/100);
  auto eval = TokenData::FromCorpus(NumberedDocuments(), cfg, 15, 2, 100, TokenData::Split::kEval);
  ASSERT_TRUE(train.ok()) << train.status();
  ASSERT_TRUE(eval.ok()) << eval.status();
  const auto a = DocumentsIn(**train), b = DocumentsIn(**eval);
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  std::vector<int64_t> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  EXPECT_TRUE(both.empty()) << "documents with tokens on both sides: " << both.size();
  // Every document is on one side, and the sides are the seeded fraction's (within a few documents).
  EXPECT_GE(a.size() + b.size(), 54u) << "only the packed tails (< 16 tokens each) may drop documents";
  EXPECT_GT(b.size(), 8u);
  EXPECT_LT(b.size(), 30u);
  // The same split on every open.
  auto again = TokenData::FromCorpus(NumberedDocuments(), cfg, 15, 2, 100, TokenData::Split::kEval);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(DocumentsIn(**again), b);
  // Rows still pack documents together, each at position 0 from its start.
  MicroBatch m;
  (*train)->Rows(0, (*train)->num_rows(), &m);
  EXPECT_TRUE(m.multi_document);
}

}  // namespace
}  // namespace ftd::engine

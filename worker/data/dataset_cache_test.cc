// The prepared-dataset cache on real files: under a confined worker, an entry read or written through
// a symbolic link that leads out of the job's roots is refused, as the worker's other opens are; an
// entry swapped for a link is never read through it, and a cache directory anyone may write to is not
// used.
#include "worker/data/dataset_cache.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "nlohmann/json.hpp"
#include "worker/data/bpe.h"
#include "worker/data/utf8.h"

#include "worker/data/confined_open.h"

namespace ftd::data {
namespace {

namespace fs = std::filesystem;

Corpus ThreeIds() {
  Corpus c;
  c.ids = {1, 2, 3};
  c.loss = {1, 1, 0};
  c.docs = {0, 3};
  c.lines = 1;
  return c;
}

TEST(DatasetCacheTest, AnEntryBehindALinkOutOfTheRootsIsNeitherReadNorWritten) {
  char tmpl[] = "/tmp/ftd-cache-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path base = tmpl, root = base / "root", outside = base / "outside";
  fs::create_directories(root);
  fs::create_directories(outside);
  ASSERT_TRUE(WriteCorpus((outside / "entry").string(), ThreeIds()).ok());  // before confining: anywhere
  fs::create_symlink(outside, root / "cache");
  ASSERT_TRUE(ConfineOpens({{root.string(), true, false}}).ok());

  auto read = ReadCorpus((root / "cache" / "entry").string());
  EXPECT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("not permitted"), std::string::npos) << read.status();
  auto written = WriteCorpus((root / "cache" / "other").string(), ThreeIds());
  EXPECT_FALSE(written.ok());
  EXPECT_NE(written.message().find("not permitted"), std::string::npos) << written;
  EXPECT_FALSE(fs::exists(outside / "other"));

  // A real directory beneath the root works as before.
  ASSERT_TRUE(WriteCorpus((root / "real" / "entry").string(), ThreeIds()).ok());
  auto again = ReadCorpus((root / "real" / "entry").string());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ids, ThreeIds().ids);

  ASSERT_TRUE(ConfineOpens({}).ok());
  std::error_code ec;
  fs::remove_all(base, ec);
}

// A byte-level tokenizer (one id per byte, no merges) and a one-line JSONL file in a fresh directory.
class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ftd-prepare-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    base_ = tmpl;
    fs::create_directories(base_ / "tok");
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) {
      std::string spelled;
      AppendUtf8(ByteLevelChar(static_cast<uint8_t>(b)), &spelled);
      vocab[spelled] = b;
    }
    const nlohmann::json tok = {
        {"version", "1.0"},
        {"added_tokens", nlohmann::json::array({{{"id", 256}, {"content", "<eos>"}, {"single_word", false},
                                                 {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                                 {"special", true}}})}, {"normalizer", nullptr},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                           {"use_regex", false}}},
        {"post_processor", nullptr},
        {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
    std::ofstream(base_ / "tok" / "tokenizer.json") << tok.dump();
    std::ofstream(base_ / "tok" / "tokenizer_config.json") << R"({"eos_token": "<eos>"})";
    std::ofstream(base_ / "data.jsonl") << "{\"text\": \"abc\"}\n";
    request_.path = (base_ / "data.jsonl").string();
    request_.tokenizer_dir = (base_ / "tok").string();
    request_.format.text_field = "text";
    request_.cache_dir = (base_ / "cache").string();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(base_, ec);
  }
  fs::path base_;
  PrepareRequest request_;
};

TEST_F(PrepareTest, AnEntrySwappedForALinkIsNotReadThroughItAndOnlyTheLinkIsRemoved) {
  auto first = PrepareJsonl(request_);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->reused);
  ASSERT_FALSE(first->dir.empty()) << first->cache_error;
  EXPECT_NE(first->corpus.ids, ThreeIds().ids);
  auto second = PrepareJsonl(request_);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->reused);

  // Another user's entry of the same key, holding other ids, linked in place of ours.
  const std::string key = fs::path(first->dir).filename().string();
  ASSERT_TRUE(WriteCorpus((base_ / "victim" / key).string(), ThreeIds()).ok());
  fs::remove_all(first->dir);
  fs::create_directory_symlink(base_ / "victim" / key, first->dir);

  auto third = PrepareJsonl(request_);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_FALSE(third->reused) << "read through the link";
  EXPECT_EQ(third->corpus.ids, first->corpus.ids);
  EXPECT_TRUE(fs::is_directory(fs::symlink_status(first->dir))) << "a real entry replaces the link";
  EXPECT_TRUE(fs::exists(base_ / "victim" / key / "meta.json")) << "the link's target is left alone";
  auto victim = ReadCorpus((base_ / "victim" / key).string());
  ASSERT_TRUE(victim.ok()) << victim.status();
  EXPECT_EQ(victim->ids, ThreeIds().ids);
}

TEST_F(PrepareTest, ACacheDirectoryEveryoneMayWriteToIsNotUsed) {
  auto first = PrepareJsonl(request_);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_FALSE(first->dir.empty()) << first->cache_error;
  ASSERT_EQ(::chmod(request_.cache_dir.c_str(), 0777), 0);

  auto again = PrepareJsonl(request_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->reused) << "an entry anyone could have written was trusted";
  EXPECT_TRUE(again->dir.empty());
  EXPECT_NE(again->cache_error.find("spec.data.cache_dir"), std::string::npos) << again->cache_error;
  EXPECT_NE(again->cache_error.find("writable by every user"), std::string::npos) << again->cache_error;
  EXPECT_NE(again->cache_error.find("chmod o-w"), std::string::npos) << again->cache_error;
  EXPECT_EQ(again->corpus.ids, first->corpus.ids) << "the job still gets its data";
}

TEST(DefaultCacheDirTest, WithoutAHomeDirectoryItIsTheWorkersOwnDirectory) {
  const char* home = std::getenv("HOME");
  const std::string saved = home != nullptr ? home : "";
  char tmpl[] = "/tmp/ftd-home-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  ::unsetenv("FTD_DATA_CACHE");
  ::setenv("HOME", tmpl, 1);
  EXPECT_EQ(DefaultCacheDir(), std::string(tmpl) + "/.cache/ftd/data");
  ::unsetenv("HOME");
  EXPECT_EQ(DefaultCacheDir(), "/tmp/ftd-data-cache-" + std::to_string(::geteuid()));
  ::setenv("HOME", "/nonexistent", 1);  // a service user's
  EXPECT_EQ(DefaultCacheDir(), "/tmp/ftd-data-cache-" + std::to_string(::geteuid()));
  if (home != nullptr) {
    ::setenv("HOME", saved.c_str(), 1);
  } else {
    ::unsetenv("HOME");
  }
  ::rmdir(tmpl);
}

}  // namespace
}  // namespace ftd::data

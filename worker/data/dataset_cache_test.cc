// The prepared-dataset cache under a confined worker: an entry read or written through a symbolic
// link that leads out of the job's roots is refused, as the worker's other opens are.
#include "worker/data/dataset_cache.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

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

}  // namespace
}  // namespace ftd::data

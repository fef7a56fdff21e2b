// Store: ids, request_id idempotence, events, schema-version and corruption checks. Real SQLite files.
#include "server/store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace ftd::server {
namespace {

namespace fs = std::filesystem;

fs::path TempDb() {
  fs::path d = fs::temp_directory_path() / ("ftd-store-" + std::to_string(::getpid()) + "-" +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d / "ftd.db";
}

ftd::v1::Job NewJob(const std::string& request_id) {
  ftd::v1::Job j;
  j.set_state(ftd::v1::QUEUED);
  j.set_owner("ana");
  j.set_request_id(request_id);
  j.mutable_spec()->set_steps(3);
  return j;
}

TEST(Store, IdsAreSequentialAndRequestIdsDeduplicate) {
  auto s = Store::Open(TempDb().string());
  ASSERT_TRUE(s.ok()) << s.status();
  auto a = (*s)->Insert(NewJob("r1"), 1);
  auto b = (*s)->Insert(NewJob(""), 2);
  auto again = (*s)->Insert(NewJob("r1"), 3);
  ASSERT_TRUE(a.ok() && b.ok() && again.ok());
  EXPECT_EQ(a->first.id(), "j-000001");
  EXPECT_EQ(b->first.id(), "j-000002");
  EXPECT_TRUE(a->second);
  EXPECT_FALSE(again->second);
  EXPECT_EQ(again->first.id(), "j-000001");
  auto got = (*s)->Get("j-000001");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->spec().steps(), 3);
  EXPECT_EQ((*s)->Get("j-000009").status().code(), absl::StatusCode::kNotFound);
}

TEST(Store, EventsAreNumberedPerJobAndReadAfterASequence) {
  auto s = Store::Open(TempDb().string());
  ASSERT_TRUE(s.ok());
  auto a = (*s)->Insert(NewJob(""), 1);
  ASSERT_TRUE(a.ok());
  for (int i = 0; i < 3; ++i) {
    ftd::v1::JobEvent e;
    e.set_log("line " + std::to_string(i));
    ASSERT_TRUE((*s)->AppendEvent(a->first.id(), e, 10 + i).ok());
  }
  auto all = (*s)->Events(a->first.id(), 0, 100);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 4u);  // the QUEUED state event, then three logs
  EXPECT_TRUE((*all)[0].has_state());
  EXPECT_EQ((*all)[3].seq(), 4);
  auto tail = (*s)->Events(a->first.id(), 2, 100);
  ASSERT_EQ(tail->size(), 2u);
  EXPECT_EQ((*tail)[0].log(), "line 1");
  EXPECT_TRUE((*s)->IntegrityCheck().ok());
}

TEST(Store, ReopeningKeepsEverythingAndIdsAreNotReused) {
  const fs::path db = TempDb();
  {
    auto s = Store::Open(db.string());
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->Insert(NewJob("x"), 1).ok());
  }
  auto s = Store::Open(db.string());
  ASSERT_TRUE(s.ok()) << s.status();
  auto b = (*s)->Insert(NewJob("y"), 2);
  EXPECT_EQ(b->first.id(), "j-000002");
}

TEST(Store, NewerSchemaIsRefused) {
  const fs::path db = TempDb();
  { ASSERT_TRUE(Store::Open(db.string()).ok()); }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "UPDATE meta SET value = '99' WHERE key = 'schema_version'", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(raw);
  auto s = Store::Open(db.string());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("schema version 99"), absl::string_view::npos) << s.status();
}

TEST(Store, CorruptFileIsRefused) {
  const fs::path db = TempDb();
  { std::ofstream(db) << std::string(4096, 'x'); }
  auto s = Store::Open(db.string());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << s.status();
  EXPECT_NE(s.status().message().find("corrupt"), absl::string_view::npos) << s.status();
}

}  // namespace
}  // namespace ftd::server

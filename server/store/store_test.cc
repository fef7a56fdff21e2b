// Store: ids, request_id idempotence (also with a full queue), the queue limit under concurrent
// inserts, reads beside a write in progress, listing (every filter, both orders, keyset pages,
// index-only plans), events, deletion, the v1 -> v2 upgrade, schema-version and corruption checks,
// and a full disk. Real SQLite files.
#include "server/store/store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sqlite3.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/testing/full_disk.h"

namespace ftd::server {
namespace {

namespace fs = std::filesystem;
using ftd::v1::JobState;

constexpr int64_t kNoLimit = 1'000'000;

fs::path TempDir() {
  fs::path d = fs::temp_directory_path() / ("ftd-store-" + std::to_string(::getpid()) + "-" +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

fs::path TempDb() { return TempDir() / "ftd.db"; }

ftd::v1::Job NewJob(const std::string& request_id, const std::string& owner = "ana",
                    ftd::v1::JobKind kind = ftd::v1::FINETUNE) {
  ftd::v1::Job j;
  j.set_state(ftd::v1::QUEUED);
  j.set_owner(owner);
  j.set_kind(kind);
  j.set_request_id(request_id);
  j.mutable_spec()->set_steps(3);
  return j;
}

absl::Status SetState(Store& s, const std::string& id, JobState state) {
  return s
      .Update(
          id,
          [&](ftd::v1::Job& j, std::vector<ftd::v1::JobEvent>& events) {
            j.set_state(state);
            ftd::v1::JobEvent e;
            *e.mutable_state() = j;
            events.push_back(e);
            return absl::OkStatus();
          },
          100)
      .status();
}

// Runs a read-only SQL query on the file through a connection of its own; the first column of each row.
std::vector<std::string> Query(const fs::path& db, const std::string& sql) {
  sqlite3* raw = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(raw, sql.c_str(), -1, &q, nullptr), SQLITE_OK) << sqlite3_errmsg(raw);
  std::vector<std::string> rows;
  while (sqlite3_step(q) == SQLITE_ROW) {
    const unsigned char* t = sqlite3_column_text(q, 0);
    rows.push_back(t == nullptr ? "" : reinterpret_cast<const char*>(t));
  }
  sqlite3_finalize(q);
  sqlite3_close(raw);
  return rows;
}

TEST(Store, IdsAreSequentialAndRequestIdsDeduplicate) {
  auto s = Store::Open(TempDb().string());
  ASSERT_TRUE(s.ok()) << s.status();
  auto a = (*s)->Insert(NewJob("r1"), 1, kNoLimit);
  auto b = (*s)->Insert(NewJob(""), 2, kNoLimit);
  auto again = (*s)->Insert(NewJob("r1"), 3, kNoLimit);
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

// Request ids are per owner: the same id from another owner is another job, so that one user can
// neither read another's job through a shared id nor take an id before its owner uses it.
TEST(Store, RequestIdsArePerOwner) {
  auto s = Store::Open(TempDb().string());
  ASSERT_TRUE(s.ok()) << s.status();
  auto bob = (*s)->Insert(NewJob("nightly-1", "bob"), 1, kNoLimit);
  auto alice = (*s)->Insert(NewJob("nightly-1", "alice"), 2, kNoLimit);
  ASSERT_TRUE(bob.ok() && alice.ok()) << bob.status() << alice.status();
  EXPECT_TRUE(bob->second);
  EXPECT_TRUE(alice->second) << "another owner's id is not this owner's";
  EXPECT_NE(alice->first.id(), bob->first.id());
  auto retry = (*s)->Insert(NewJob("nightly-1", "alice"), 3, kNoLimit);
  ASSERT_TRUE(retry.ok());
  EXPECT_FALSE(retry->second);
  EXPECT_EQ(retry->first.id(), alice->first.id());
  EXPECT_EQ(retry->first.owner(), "alice");
}

TEST(Store, AKnownRequestIdIsAnsweredEvenWhenTheQueueIsFull) {
  auto s = Store::Open(TempDb().string());
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->Insert(NewJob("first"), 1, 2).ok());
  ASSERT_TRUE((*s)->Insert(NewJob("second"), 2, 2).ok());
  auto full = (*s)->Insert(NewJob("third"), 3, 2);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();
  EXPECT_NE(full.status().message().find("the queue is full (2 jobs queued, limit 2)"), absl::string_view::npos)
      << full.status();
  auto retry = (*s)->Insert(NewJob("first"), 4, 2);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_FALSE(retry->second);
  EXPECT_EQ(retry->first.id(), "j-000001");
  // A job that is no longer queued frees its place.
  ASSERT_TRUE(SetState(**s, "j-000001", ftd::v1::RUNNING).ok());
  auto third = (*s)->Insert(NewJob("third"), 5, 2);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE(third->second);
  EXPECT_EQ(third->first.id(), "j-000003");
}

// 30 submits at once against a limit of 5, through one connection shared by the threads and
// through several connections to the same file: exactly 5 are queued, every time.
TEST(Store, TheQueueLimitHoldsUnderConcurrentInserts) {
  constexpr int kThreads = 30, kLimit = 5, kRounds = 10;
  for (int connections : {1, 3}) {
    for (int round = 0; round < kRounds; ++round) {
      const fs::path db = TempDir() / absl::StrCat("r", connections, "-", round, ".db");
      std::vector<std::unique_ptr<Store>> stores;
      for (int c = 0; c < connections; ++c) {
        auto s = Store::Open(db.string());
        ASSERT_TRUE(s.ok()) << s.status();
        stores.push_back(std::move(*s));
      }
      std::atomic<int> ready{0}, created{0}, full{0}, other{0};
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          ready.fetch_add(1);
          while (ready.load() < kThreads) {
          }
          auto r = stores[t % connections]->Insert(NewJob(absl::StrCat("req-", t)), t, kLimit);
          if (r.ok() && r->second) {
            created.fetch_add(1);
          } else if (r.status().code() == absl::StatusCode::kResourceExhausted) {
            full.fetch_add(1);
          } else {
            other.fetch_add(1);
            ADD_FAILURE() << r.status();
          }
        });
      }
      for (auto& th : threads) th.join();
      EXPECT_EQ(created.load(), kLimit) << connections << " connection(s), round " << round;
      EXPECT_EQ(full.load(), kThreads - kLimit);
      EXPECT_EQ(other.load(), 0);
      auto n = stores[0]->CountInState(ftd::v1::QUEUED);
      ASSERT_TRUE(n.ok());
      EXPECT_EQ(*n, kLimit);
    }
  }
}

// Reads have connections of their own: one runs while a write transaction is open (here: inside
// Update's mutate, before its commit and fsync) and sees the last committed state.
TEST(Store, ReadsDoNotWaitForAWriteInProgress) {
  auto opened = Store::Open(TempDb().string());
  ASSERT_TRUE(opened.ok());
  Store& s = **opened;
  ASSERT_TRUE(s.Insert(NewJob("a"), 1, kNoLimit).ok());
  std::future<absl::StatusOr<ftd::v1::Job>> get;
  std::future<absl::StatusOr<std::vector<ftd::v1::Job>>> list;
  bool finished_during_write = false;
  auto upd = s.Update(
      "j-000001",
      [&](ftd::v1::Job& j, std::vector<ftd::v1::JobEvent>&) {
        j.set_state(ftd::v1::RUNNING);
        get = std::async(std::launch::async, [&] { return s.Get("j-000001"); });
        list = std::async(std::launch::async, [&] {
          int64_t next = 0;
          return s.List(JobFilter{}, &next);
        });
        finished_during_write = get.wait_for(std::chrono::seconds(10)) == std::future_status::ready &&
                                list.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
        return absl::OkStatus();
      },
      2);
  ASSERT_TRUE(upd.ok()) << upd.status();
  EXPECT_TRUE(finished_during_write) << "a read waited for the write transaction";
  auto g = get.get();
  auto l = list.get();
  ASSERT_TRUE(g.ok() && l.ok());
  EXPECT_EQ(g->state(), ftd::v1::QUEUED);  // the write had not committed yet
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].state(), ftd::v1::QUEUED);
  auto after = s.Get("j-000001");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->state(), ftd::v1::RUNNING);
}

TEST(Store, EventsAreNumberedPerJobAndReadAfterASequence) {
  auto s = Store::Open(TempDb().string());
  ASSERT_TRUE(s.ok());
  auto a = (*s)->Insert(NewJob(""), 1, kNoLimit);
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

TEST(Store, EventsAreReadAtMostKMaxEventsPerReadAtATime) {
  auto s = Store::Open(TempDb().string());
  ASSERT_TRUE(s.ok());
  auto a = (*s)->Insert(NewJob(""), 1, kNoLimit);
  ASSERT_TRUE(a.ok());
  const int total = kMaxEventsPerRead + 234;  // and the QUEUED event
  for (int i = 0; i < total; ++i) {
    ftd::v1::JobEvent e;
    e.set_log(absl::StrCat("line ", i));
    ASSERT_TRUE((*s)->AppendEvent(a->first.id(), e, 10 + i).ok());
  }
  for (int bad : {0, -1, kMaxEventsPerRead + 1}) {
    auto r = (*s)->Events(a->first.id(), 0, bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(absl::StrCat("1 to ", kMaxEventsPerRead)), absl::string_view::npos);
  }
  int64_t after = 0;
  std::vector<size_t> sizes;
  for (;;) {
    auto r = (*s)->Events(a->first.id(), after, kMaxEventsPerRead);
    ASSERT_TRUE(r.ok()) << r.status();
    if (r->empty()) break;
    sizes.push_back(r->size());
    EXPECT_EQ(r->front().seq(), after + 1);
    after = r->back().seq();
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{static_cast<size_t>(kMaxEventsPerRead), 235}));
  EXPECT_EQ(after, total + 1);
  auto plan = (*s)->EventsPlan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_FALSE(plan->empty());
  for (const auto& line : *plan) {
    EXPECT_EQ(line.rfind("SEARCH ", 0), 0u) << line;
    EXPECT_EQ(line.find("TEMP B-TREE"), std::string::npos) << line;
  }
}

// Every filter combination in both orders and several page sizes, paged to the end through the
// cursors, against the list the test keeps itself.
TEST(Store, ListPagesEveryFilterInBothOrders) {
  auto opened = Store::Open(TempDb().string());
  ASSERT_TRUE(opened.ok());
  Store& s = **opened;
  struct Row {
    int64_t seq;
    JobState state;
    std::string owner;
    ftd::v1::JobKind kind;
  };
  std::vector<Row> model;
  const JobState states[] = {ftd::v1::QUEUED, ftd::v1::RUNNING, ftd::v1::SUCCEEDED, ftd::v1::FAILED,
                             ftd::v1::CANCELLED};
  const std::string owners[] = {"ana", "bob", "cy"};
  for (int i = 0; i < 240; ++i) {
    // Varied by different periods so that every combination occurs, interleaved.
    const std::string owner = owners[(i * 7) % 3];
    const auto kind = i % 5 == 0 ? ftd::v1::PROFILE : ftd::v1::FINETUNE;
    const JobState state = states[(i * 3 + i / 11) % 5];
    auto r = s.Insert(NewJob("", owner, kind), i, kNoLimit);
    ASSERT_TRUE(r.ok()) << r.status();
    if (state != ftd::v1::QUEUED) {
      ASSERT_TRUE(SetState(s, r->first.id(), state).ok());
    }
    model.push_back({i + 1, state, owner, kind});
  }
  const std::vector<std::vector<JobState>> state_filters = {
      {}, {ftd::v1::QUEUED}, {ftd::v1::CANCELLED, ftd::v1::RUNNING}, {ftd::v1::FAILED, ftd::v1::FAILED}};
  int checked = 0;
  for (const auto& sf : state_filters) {
    for (const std::string owner : {"", "bob", "nobody"}) {
      for (auto kind : {ftd::v1::JOB_KIND_UNSPECIFIED, ftd::v1::PROFILE}) {
        for (bool newest_first : {false, true}) {
          std::vector<std::string> want;
          for (const Row& r : model) {
            if (!sf.empty() && std::find(sf.begin(), sf.end(), r.state) == sf.end()) continue;
            if (!owner.empty() && r.owner != owner) continue;
            if (kind != ftd::v1::JOB_KIND_UNSPECIFIED && r.kind != kind) continue;
            want.push_back(absl::StrFormat("j-%06d", r.seq));
          }
          if (newest_first) std::reverse(want.begin(), want.end());
          for (int limit : {1, 7, 50, 500}) {
            JobFilter f;
            f.states = sf;
            f.owner = owner;
            f.kind = kind;
            f.newest_first = newest_first;
            f.limit = limit;
            std::vector<std::string> got;
            for (int page = 0; page < 1000; ++page) {
              int64_t next = -1;
              auto jobs = s.List(f, &next);
              ASSERT_TRUE(jobs.ok()) << jobs.status();
              ASSERT_LE(jobs->size(), static_cast<size_t>(limit));
              for (const auto& j : *jobs) got.push_back(j.id());
              if (next == 0) break;
              ASSERT_EQ(jobs->size(), static_cast<size_t>(limit)) << "a page before the last is full";
              f.after_seq = next;
            }
            ASSERT_EQ(got, want) << "states " << sf.size() << " owner '" << owner << "' kind " << kind
                                 << " newest_first " << newest_first << " limit " << limit;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 4 * 3 * 2 * 2 * 4);
  int64_t next = 0;
  JobFilter bad;
  bad.limit = 0;
  EXPECT_EQ(s.List(bad, &next).status().code(), absl::StatusCode::kInvalidArgument);
}

// A page is found by index searches only: no table scan and no sort, whatever the filter.
TEST(Store, ListUsesAnIndexForEveryFilter) {
  auto s = Store::Open(TempDb().string());
  ASSERT_TRUE(s.ok());
  for (bool with_state : {false, true}) {
    for (bool owner : {false, true}) {
      for (bool kind : {false, true}) {
        for (bool newest_first : {false, true}) {
          JobFilter f;
          if (with_state) f.states = {ftd::v1::QUEUED, ftd::v1::FAILED};
          if (owner) f.owner = "ana";
          if (kind) f.kind = ftd::v1::PROFILE;
          f.newest_first = newest_first;
          auto plan = (*s)->ListPlan(f);
          ASSERT_TRUE(plan.ok()) << plan.status();
          ASSERT_FALSE(plan->empty());
          for (const auto& line : *plan) {
            SCOPED_TRACE(absl::StrCat("state ", with_state, " owner ", owner, " kind ", kind, " newest_first ",
                                      newest_first));
            EXPECT_EQ(line.rfind("SEARCH jobs USING ", 0), 0u) << line;
            EXPECT_EQ(line.find("TEMP B-TREE"), std::string::npos) << line;
          }
        }
      }
    }
  }
}

TEST(Store, DeleteRemovesAFinishedJobAndItsEventsTogether) {
  const fs::path db = TempDb();
  auto opened = Store::Open(db.string());
  ASSERT_TRUE(opened.ok());
  Store& s = **opened;
  auto a = s.Insert(NewJob("ra"), 1, kNoLimit);
  auto b = s.Insert(NewJob("rb"), 2, kNoLimit);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int i = 0; i < 5; ++i) {
    ftd::v1::JobEvent e;
    e.set_log("x");
    ASSERT_TRUE(s.AppendEvent("j-000001", e, 3).ok());
    ASSERT_TRUE(s.AppendEvent("j-000002", e, 3).ok());
  }
  for (JobState live : {ftd::v1::QUEUED, ftd::v1::RUNNING}) {
    if (live != ftd::v1::QUEUED) {
      ASSERT_TRUE(SetState(s, "j-000001", live).ok());
    }
    auto st = s.Delete("j-000001");
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    EXPECT_NE(st.message().find(ftd::v1::JobState_Name(live)), absl::string_view::npos) << st;
  }
  EXPECT_EQ(s.Delete("j-000099").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(SetState(s, "j-000001", ftd::v1::CANCELLED).ok());
  ASSERT_TRUE(s.Delete("j-000001").ok());
  EXPECT_EQ(s.Get("j-000001").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM events WHERE job_seq = 1"), std::vector<std::string>{"0"});
  EXPECT_EQ(Query(db, "SELECT COUNT(*) FROM jobs WHERE seq = 1"), std::vector<std::string>{"0"});
  auto others = s.Events("j-000002", 0, 100);
  ASSERT_TRUE(others.ok());
  EXPECT_EQ(others->size(), 6u);  // QUEUED and five logs
  // The id is not reused; the request id is free again.
  auto again = s.Insert(NewJob("ra"), 4, kNoLimit);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->second);
  EXPECT_EQ(again->first.id(), "j-000003");
  int64_t next = 0;
  auto listed = s.List(JobFilter{}, &next);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].id(), "j-000002");
  EXPECT_TRUE(s.IntegrityCheck().ok());
}

TEST(Store, ReopeningKeepsEverythingAndIdsAreNotReused) {
  const fs::path db = TempDb();
  {
    auto s = Store::Open(db.string());
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->Insert(NewJob("x"), 1, kNoLimit).ok());
  }
  auto s = Store::Open(db.string());
  ASSERT_TRUE(s.ok()) << s.status();
  auto b = (*s)->Insert(NewJob("y"), 2, kNoLimit);
  EXPECT_EQ(b->first.id(), "j-000002");
}

// A database written by the first schema (the DDL it shipped with, below) is upgraded in place
// when opened: its jobs and events stay, the listing indexes appear, request ids become per owner,
// ids continue after the highest ever given (a deleted job's included).
TEST(Store, AVersion1DatabaseIsUpgradedInPlace) {
  const fs::path db = TempDb();
  {
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(db.c_str(), &raw), SQLITE_OK);
    const char* v1 =
        "PRAGMA journal_mode=WAL;"
        "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE jobs(seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, request_id TEXT UNIQUE,"
        " state INTEGER NOT NULL, owner TEXT NOT NULL, kind INTEGER NOT NULL, priority INTEGER NOT NULL,"
        " next_event INTEGER NOT NULL DEFAULT 1, job BLOB NOT NULL);"
        "CREATE INDEX jobs_by_state ON jobs(state, priority DESC, seq);"
        "CREATE TABLE events(job_seq INTEGER NOT NULL REFERENCES jobs(seq), seq INTEGER NOT NULL,"
        " unix_ms INTEGER NOT NULL, event BLOB NOT NULL, PRIMARY KEY(job_seq, seq)) WITHOUT ROWID;"
        "INSERT INTO meta(key, value) VALUES('schema_version', '1');";
    ASSERT_EQ(sqlite3_exec(raw, v1, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(raw);
    for (int i = 1; i <= 4; ++i) {
      ftd::v1::Job j = NewJob(absl::StrCat("old-", i), i == 2 ? "bob" : "ana");
      j.set_id(absl::StrFormat("j-%06d", i));
      j.set_state(i == 3 ? ftd::v1::SUCCEEDED : ftd::v1::QUEUED);
      ftd::v1::JobEvent e;
      *e.mutable_state() = j;
      e.set_seq(1);
      const std::string job = j.SerializeAsString(), event = e.SerializeAsString();
      sqlite3_stmt* q = nullptr;
      ASSERT_EQ(sqlite3_prepare_v2(raw,
                                   "INSERT INTO jobs(id, request_id, state, owner, kind, priority, next_event, job)"
                                   " VALUES(?, ?, ?, ?, ?, 0, 2, ?)",
                                   -1, &q, nullptr),
                SQLITE_OK);
      sqlite3_bind_text(q, 1, j.id().c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(q, 2, j.request_id().c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int(q, 3, j.state());
      sqlite3_bind_text(q, 4, j.owner().c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int(q, 5, j.kind());
      sqlite3_bind_blob(q, 6, job.data(), static_cast<int>(job.size()), SQLITE_TRANSIENT);
      ASSERT_EQ(sqlite3_step(q), SQLITE_DONE);
      sqlite3_finalize(q);
      ASSERT_EQ(sqlite3_prepare_v2(raw, "INSERT INTO events(job_seq, seq, unix_ms, event) VALUES(?, 1, 5, ?)", -1,
                                   &q, nullptr),
                SQLITE_OK);
      sqlite3_bind_int(q, 1, i);
      sqlite3_bind_blob(q, 2, event.data(), static_cast<int>(event.size()), SQLITE_TRANSIENT);
      ASSERT_EQ(sqlite3_step(q), SQLITE_DONE);
      sqlite3_finalize(q);
    }
    // The newest job was deleted: its id is not given again.
    ASSERT_EQ(sqlite3_exec(raw, "DELETE FROM events WHERE job_seq = 4; DELETE FROM jobs WHERE seq = 4", nullptr,
                           nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(raw);
  }
  {
    auto s = Store::Open(db.string());
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(Query(db, "SELECT value FROM meta WHERE key = 'schema_version'"),
              std::vector<std::string>{absl::StrCat(kSchemaVersion)});
    const auto indexes = Query(db, "SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE 'jobs_list_%'"
                                   " ORDER BY name");
    EXPECT_EQ(indexes, (std::vector<std::string>{"jobs_list_kind", "jobs_list_owner", "jobs_list_owner_kind",
                                                  "jobs_list_state"}));
    JobFilter f;
    f.states = {ftd::v1::QUEUED};
    f.owner = "bob";
    int64_t next = 0;
    auto bobs = (*s)->List(f, &next);
    ASSERT_TRUE(bobs.ok()) << bobs.status();
    ASSERT_EQ(bobs->size(), 1u);
    EXPECT_EQ((*bobs)[0].id(), "j-000002");
    auto ev = (*s)->Events("j-000003", 0, 10);
    ASSERT_TRUE(ev.ok());
    ASSERT_EQ(ev->size(), 1u);
    auto retry = (*s)->Insert(NewJob("old-1"), 9, kNoLimit);
    ASSERT_TRUE(retry.ok());
    EXPECT_FALSE(retry->second);
    auto fresh = (*s)->Insert(NewJob("new"), 9, kNoLimit);
    ASSERT_TRUE(fresh.ok());
    EXPECT_EQ(fresh->first.id(), "j-000005");
    auto other_owner = (*s)->Insert(NewJob("old-2", "ana"), 9, kNoLimit);  // old-2 is bob's
    ASSERT_TRUE(other_owner.ok()) << other_owner.status();
    EXPECT_TRUE(other_owner->second);
    EXPECT_EQ(other_owner->first.id(), "j-000006");
    EXPECT_TRUE((*s)->IntegrityCheck().ok());
    EXPECT_EQ(Query(db, "PRAGMA foreign_key_check"), std::vector<std::string>{});
  }
  // Opening an up-to-date file again changes nothing.
  auto again = Store::Open(db.string());
  ASSERT_TRUE(again.ok()) << again.status();
  int64_t next = 0;
  auto all = (*again)->List(JobFilter{}, &next);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 5u);
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

// The database on a 4 MiB tmpfs (mounted in a mount namespace of this process's own, so nothing
// outside sees it). Once the disk is full, writes are RESOURCE_EXHAUSTED naming the disk and the
// data directory, nothing of them is left behind, and the same Store writes again once there is room.
TEST(Store, AFullDiskIsResourceExhaustedAndTheStoreRecovers) {
  const fs::path dir = TempDir() / "data";
  fs::create_directories(dir);
  if (const std::string why = testing::MountSmallTmpfs(dir, "4m"); !why.empty()) GTEST_SKIP() << why;
  testing::Unmount unmount{dir};

  const fs::path db = dir / "ftd.db";
  auto opened = Store::Open(db.string());
  ASSERT_TRUE(opened.ok()) << opened.status();
  Store& s = **opened;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.Insert(NewJob(absl::StrCat("before-", i)), i, kNoLimit).ok());

  const fs::path filler = testing::FillDisk(dir);
  // A record larger than any free space SQLite's files may still hold.
  ftd::v1::Job big = NewJob("big");
  big.set_name(std::string(512 * 1024, 'n'));
  auto full = s.Insert(big, 10, kNoLimit);
  ASSERT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();
  const std::string msg(full.status().message());
  EXPECT_NE(msg.find("the disk is full"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("ftd-test-tmpfs (tmpfs) mounted on " + dir.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("Free space"), std::string::npos) << msg;

  // An update of an existing job fails the same way and changes nothing.
  auto upd = s.Update(
      "j-000001",
      [&](ftd::v1::Job& j, std::vector<ftd::v1::JobEvent>& events) {
        j.set_message(std::string(512 * 1024, 'm'));
        ftd::v1::JobEvent e;
        e.set_log(std::string(512 * 1024, 'l'));
        events.push_back(e);
        return absl::OkStatus();
      },
      11);
  EXPECT_EQ(upd.status().code(), absl::StatusCode::kResourceExhausted) << upd.status();
  auto j1 = s.Get("j-000001");
  ASSERT_TRUE(j1.ok()) << j1.status();
  EXPECT_EQ(j1->message(), "");
  auto ev = s.Events("j-000001", 0, 10);
  ASSERT_TRUE(ev.ok()) << ev.status();
  EXPECT_EQ(ev->size(), 1u);
  auto queued = s.CountInState(ftd::v1::QUEUED);
  ASSERT_TRUE(queued.ok());
  EXPECT_EQ(*queued, 3);

  // Room again: the same connection writes, and the failed insert left no trace (the next id follows).
  fs::remove(filler);
  auto after = s.Insert(big, 12, kNoLimit);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->second);
  EXPECT_EQ(after->first.id(), "j-000004");
  EXPECT_TRUE(s.IntegrityCheck().ok());
  auto reopened = Store::Open(db.string());
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  int64_t next = 0;
  auto all = (*reopened)->List(JobFilter{}, &next);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 4u);
}

}  // namespace
}  // namespace ftd::server

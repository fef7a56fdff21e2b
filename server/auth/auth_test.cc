// Authorization rules for every role, tokens (hash-only storage, expiry, revocation), the audit
// log's paging, the listener's loopback rule, and how a call's credentials become an identity.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/match.h"
#include "server/auth/auth.h"
#include "server/auth/auth_store.h"
#include "server/auth/authz.h"
#include "server/api/listen_config.h"
#include "server/testing/fake_clock.h"

namespace ftd::server {
namespace {

namespace fs = std::filesystem;

using testing::FakeClock;

Identity Who(const std::string& user, ftd::v1::Role role) {
  Identity i;
  i.set_user(user);
  i.set_role(role);
  return i;
}

ftd::v1::Job JobOf(const std::string& owner) {
  ftd::v1::Job j;
  j.set_id("j-000001");
  j.set_owner(owner);
  j.mutable_spec()->set_steps(3);
  j.set_request_id("r1");
  j.set_message("worker said /secret/path");
  return j;
}

TEST(Authz, OwnerAndAdminsReadAndChangeOthersAreDeniedNamingTheOwner) {
  const auto ana = Who("ana", ftd::v1::ROLE_USER), bob = Who("bob", ftd::v1::ROLE_USER),
             root = Who("root", ftd::v1::ROLE_ADMIN);
  const auto job = JobOf("ana");
  EXPECT_TRUE(MayReadJob(ana, job, "read the spec of").ok());
  EXPECT_TRUE(MayChangeJob(ana, job, "cancel").ok());
  EXPECT_TRUE(MayReadJob(root, job, "read the spec of").ok());
  EXPECT_TRUE(MayChangeJob(root, job, "cancel").ok());
  for (const auto& st : {MayReadJob(bob, job, "read the spec of"), MayChangeJob(bob, job, "cancel")}) {
    EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_NE(st.message().find("belongs to ana"), std::string::npos) << st.message();
  }
  // a user with an empty name owns nothing, not even jobs with an empty owner
  EXPECT_FALSE(MayChangeJob(Who("", ftd::v1::ROLE_USER), JobOf(""), "cancel").ok());
}

TEST(Authz, SubmitOwnerPriorityCapAndAdministration) {
  const auto ana = Who("ana", ftd::v1::ROLE_USER), root = Who("root", ftd::v1::ROLE_ADMIN);
  EXPECT_EQ(*SubmitOwner(ana, ""), "ana");
  EXPECT_EQ(*SubmitOwner(ana, "ana"), "ana");
  EXPECT_EQ(SubmitOwner(ana, "bob").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(*SubmitOwner(root, "bob"), "bob");
  EXPECT_TRUE(MaySetPriority(ana, 100, 100).ok());
  EXPECT_EQ(MaySetPriority(ana, 101, 100).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(MaySetPriority(root, 1000, 100).ok());
  EXPECT_EQ(MayAdminister(ana, "create tokens").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(MayAdminister(root, "create tokens").ok());
}

TEST(Authz, OthersSeeOnlyThePublicColumns) {
  auto job = JobOf("ana");
  RedactForOthers(Who("ana", ftd::v1::ROLE_USER), &job);
  EXPECT_TRUE(job.has_spec());
  RedactForOthers(Who("root", ftd::v1::ROLE_ADMIN), &job);
  EXPECT_TRUE(job.has_spec());
  RedactForOthers(Who("bob", ftd::v1::ROLE_USER), &job);
  EXPECT_FALSE(job.has_spec());
  EXPECT_EQ(job.message(), "");
  EXPECT_EQ(job.request_id(), "");
  EXPECT_EQ(job.owner(), "ana");
  EXPECT_EQ(job.id(), "j-000001");
  EXPECT_TRUE(job.public_only());
}

TEST(Authz, OthersSeeWhyAQueuedJobWaitsButNotAFailuresMessage) {
  const auto bob = Who("bob", ftd::v1::ROLE_USER);
  auto waiting = JobOf("ana");
  waiting.set_state(ftd::v1::QUEUED);
  waiting.set_reason("WAITING_FOR_MEMORY");
  waiting.set_message("it fits on no GPU now: predicted peak 40.0 GiB");
  RedactForOthers(bob, &waiting);
  EXPECT_EQ(waiting.message(), "it fits on no GPU now: predicted peak 40.0 GiB");
  // a retry waiting out its backoff keeps the failure's code and text: the worker's words stay private
  auto retrying = JobOf("ana");
  retrying.set_state(ftd::v1::QUEUED);
  retrying.set_reason("WORKER_EXIT");
  RedactForOthers(bob, &retrying);
  EXPECT_EQ(retrying.message(), "");
  auto failed = JobOf("ana");
  failed.set_state(ftd::v1::FAILED);
  failed.set_reason("QUOTA");
  RedactForOthers(bob, &failed);
  EXPECT_EQ(failed.message(), "");
  EXPECT_EQ(failed.reason(), "QUOTA");
  // no name owns nothing, not even a job with no owner
  auto unowned = JobOf("");
  RedactForOthers(Who("", ftd::v1::ROLE_USER), &unowned);
  EXPECT_FALSE(unowned.has_spec());
}

class AuthStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ftd-auth-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    auto s = AuthStore::Open((dir_ / "auth.db").string());
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  void TearDown() override { fs::remove_all(dir_); }
  AuthStore::Created Make(const std::string& user, int64_t ttl_s = 0) {
    ftd::v1::CreateTokenRequest r;
    r.set_user(user);
    r.set_ttl_seconds(ttl_s);
    auto c = store_->CreateToken(r, "root", clock_.unix_ms);
    EXPECT_TRUE(c.ok()) << c.status();
    return *c;
  }
  fs::path dir_;
  FakeClock clock_;
  std::unique_ptr<AuthStore> store_;
};

TEST_F(AuthStoreTest, OnlyTheHashIsStoredAndTheFileIsPrivate) {
  const auto c = Make("ana");
  const std::string secret = c.bearer.substr(c.bearer.rfind('_') + 1);
  ASSERT_EQ(secret.size(), 64u);
  EXPECT_EQ(fs::status(dir_ / "auth.db").permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ / "auth.db").c_str(), &db), SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT id, hash FROM tokens", -1, &q, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
  const std::string hash(static_cast<const char*>(sqlite3_column_blob(q, 1)), sqlite3_column_bytes(q, 1));
  EXPECT_EQ(hash.size(), 32u);  // SHA-256
  EXPECT_EQ(hash.find(secret), std::string::npos);
  sqlite3_finalize(q);
  sqlite3_close(db);
}

TEST_F(AuthStoreTest, VerifyAcceptsTheTokenAndRefusesForgedRevokedAndExpiredOnes) {
  const auto c = Make("ana", 60);
  auto t = store_->Verify(c.bearer, clock_.unix_ms);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->user(), "ana");
  EXPECT_EQ(t->role(), ftd::v1::ROLE_USER);
  std::string forged = c.bearer;
  forged.back() = forged.back() == '0' ? '1' : '0';
  for (const std::string& bad : {forged, std::string("ftd_x_y"), std::string("hunter2"), std::string("")}) {
    auto v = store_->Verify(bad, clock_.unix_ms);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kUnauthenticated) << bad;
    if (!bad.empty()) {
      EXPECT_EQ(v.status().message().find(bad), std::string::npos);
    }
  }
  EXPECT_EQ(store_->Verify(c.bearer, clock_.unix_ms + 60'000).status().code(), absl::StatusCode::kUnauthenticated);
  ASSERT_TRUE(store_->RevokeToken(c.token.id(), clock_.unix_ms).ok());
  auto r = store_->Verify(c.bearer, clock_.unix_ms);
  EXPECT_NE(r.status().message().find("revoked"), std::string::npos) << r.status();
  EXPECT_EQ(store_->RevokeToken("nope", clock_.unix_ms).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->ListTokens("", false, clock_.unix_ms)->size(), 0u);
  EXPECT_EQ(store_->ListTokens("", true, clock_.unix_ms)->size(), 1u);
}

TEST_F(AuthStoreTest, BadRequestsNameTheField) {
  ftd::v1::CreateTokenRequest r;
  r.set_user("Ana Smith");
  EXPECT_NE(store_->CreateToken(r, "root", 0).status().message().find("user"), std::string::npos);
  r.set_user("ana");
  r.set_ttl_seconds(kMaxTokenTtlS + 1);
  EXPECT_NE(store_->CreateToken(r, "root", 0).status().message().find("ttl_seconds"), std::string::npos);
  r.set_ttl_seconds(0);
  r.set_description(std::string(201, 'x'));
  EXPECT_NE(store_->CreateToken(r, "root", 0).status().message().find("description"), std::string::npos);
  r.set_description("laptop\x1b]0;owned\a");
  EXPECT_TRUE(absl::StartsWith(store_->CreateToken(r, "root", 0).status().message(),
                               "description holds a control character"));
}

TEST_F(AuthStoreTest, AuditPagesNewestFirstAndFilters) {
  for (int i = 0; i < 5; ++i) {
    ftd::v1::AuditRecord a;
    a.set_unix_ms(i);
    a.set_user(i % 2 == 0 ? "ana" : "bob");
    a.set_action(i < 3 ? "SubmitJob" : "CancelJob");
    ASSERT_TRUE(store_->Audit(a).ok());
  }
  ftd::v1::ListAuditRequest q;
  q.set_limit(2);
  auto p1 = store_->ListAudit(q);
  ASSERT_TRUE(p1.ok());
  ASSERT_EQ(p1->records_size(), 2);
  EXPECT_EQ(p1->records(0).seq(), 5);
  EXPECT_EQ(p1->next_before_seq(), 4);
  q.set_before_seq(p1->next_before_seq());
  q.set_limit(10);
  auto p2 = store_->ListAudit(q);
  ASSERT_EQ(p2->records_size(), 3);
  EXPECT_EQ(p2->next_before_seq(), 0);
  ftd::v1::ListAuditRequest f;
  f.set_user("ana");
  f.set_action("SubmitJob");
  EXPECT_EQ(store_->ListAudit(f)->records_size(), 2);
}

TEST_F(AuthStoreTest, AuthenticatorPrefersTheTokenThenTheCertificateAndRefusesNone) {
  AuthConfig cfg;
  cfg.admins = {"dave"};
  Authenticator a(cfg, store_.get(), &clock_, nullptr);
  const auto c = Make("ana");
  auto id = a.Authenticate({"ipv4:10.0.0.1:5", "Bearer " + c.bearer, "dave"});
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->user(), "ana");
  EXPECT_EQ(id->via(), "token " + c.token.id());
  id = a.Authenticate({"ipv4:10.0.0.1:5", std::nullopt, "dave"});
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id->role(), ftd::v1::ROLE_ADMIN);  // named by --admin
  EXPECT_EQ(a.Authenticate({"ipv4:10.0.0.1:5", std::nullopt, ""}).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(a.Authenticate({"fd:7", std::nullopt, ""}).status().code(), absl::StatusCode::kUnauthenticated);
  // a bad token is not passed over for the certificate
  EXPECT_EQ(a.Authenticate({"x", std::string("Bearer nope"), "dave"}).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(a.Authenticate({"x", std::string("Basic abc"), ""}).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(a.Authenticate({"x", std::nullopt, "Not A User"}).status().code(), absl::StatusCode::kUnauthenticated);
  ucred root{1, 0, 0}, other{2, 4242, 4242};
  EXPECT_EQ(a.Local(root).role(), ftd::v1::ROLE_ADMIN);
  EXPECT_EQ(a.Local(other).role(), ftd::v1::ROLE_USER);
}

TEST(ListenConfig, NonLoopbackNeedsTlsOrTheLoudFlag) {
  for (const char* a : {"127.0.0.1:7070", "localhost:7070", "[::1]:7070", "127.3.4.5:1"}) EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  for (const char* a : {"0.0.0.0:7070", "[::]:7070", "10.1.2.3:7070", "gpu-box:7070", "localhost.evil.com:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
  ListenConfig c;
  c.listen = "0.0.0.0:7070";
  EXPECT_EQ(c.Resolve("/d").code(), absl::StatusCode::kInvalidArgument);
  c.insecure = true;
  EXPECT_TRUE(c.Resolve("/d").ok());
  ListenConfig t;
  t.listen = "0.0.0.0:7070";
  t.tls_cert = "c.pem";
  EXPECT_NE(t.Resolve("/d").message().find("--tls-key"), std::string::npos);
  t.tls_key = "k.pem";
  EXPECT_TRUE(t.Resolve("/d").ok());
  ListenConfig u;
  u.listen = "unix:/tmp/x.sock";
  ASSERT_TRUE(u.Resolve("/d").ok());
  EXPECT_EQ(u.socket, "/tmp/x.sock");
  EXPECT_EQ(u.listen, "");
}

TEST(CallAuth, ReadsAreNotAuditedEverythingElseIs) {
  for (const char* m : {"/ftd.v1.JobService/GetJob", "/ftd.v1.JobService/ListJobs", "/ftd.v1.JobService/WatchJob",
                        "/ftd.v1.AdminService/WhoAmI", "/ftd.v1.AdminService/ListAudit", "/grpc.health.v1.Health/Check"}) {
    EXPECT_FALSE(CallAuth::IsMutating(m)) << m;
  }
  for (const char* m : {"/ftd.v1.JobService/SubmitJob", "/ftd.v1.JobService/CancelJob", "/ftd.v1.JobService/DeleteJob",
                        "/ftd.v1.JobService/PauseScheduler", "/ftd.v1.AdminService/CreateToken"}) {
    EXPECT_TRUE(CallAuth::IsMutating(m)) << m;
  }
}

}  // namespace
}  // namespace ftd::server

#include "server/auth/unauthenticated_audit.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "server/testing/fake_clock.h"

namespace ftd::server {
namespace {

namespace fs = std::filesystem;

class UnauthenticatedAuditTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ftd-unauth-audit-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    auto s = AuthStore::Open((dir_ / "auth.db").string());
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::vector<ftd::v1::AuditRecord> Records() {
    ftd::v1::ListAuditRequest req;
    req.set_limit(1000);
    auto r = store_->ListAudit(req);
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<ftd::v1::AuditRecord> out(r->records().rbegin(), r->records().rend());  // oldest first
    return out;
  }
  fs::path dir_;
  std::unique_ptr<AuthStore> store_;
  testing::FakeClock clock_;
};

TEST_F(UnauthenticatedAuditTest, AFloodFromOnePeerIsTheFirstCallThenOneRecordAMinute) {
  {
    UnauthenticatedAudit audit(store_.get(), &clock_);
    for (int i = 0; i < 3000; ++i) {
      audit.Refused("ipv4:10.1.2.3:" + std::to_string(40000 + i % 100), i < 2990 ? "CancelJob" : "SubmitJob",
                    "no credentials");
    }
    auto recs = Records();
    ASSERT_EQ(recs.size(), 1u) << "the first call only, while its minute runs";
    EXPECT_EQ(recs[0].peer(), "ipv4:10.1.2.3:40000");
    EXPECT_EQ(recs[0].action(), "CancelJob");
    EXPECT_EQ(recs[0].code(), "UNAUTHENTICATED");
    clock_.Advance(59'999);
    audit.Flush();
    EXPECT_EQ(Records().size(), 1u);
    clock_.Advance(1);
    audit.Flush();
    recs = Records();
    ASSERT_EQ(recs.size(), 2u);
    EXPECT_EQ(recs[1].peer(), "ipv4:10.1.2.3");
    EXPECT_EQ(recs[1].action(), "(several)");
    EXPECT_EQ(recs[1].detail(),
              "3000 unauthenticated calls from ipv4:10.1.2.3 in the last minute (CancelJob 2989, SubmitJob 10; the "
              "first is recorded on its own)");
    // The next minute starts with a record of its own again; what is counted when ftd stops is written.
    audit.Refused("ipv4:10.1.2.3:1", "CancelJob", "no credentials");
    audit.Refused("ipv4:10.1.2.3:1", "CancelJob", "no credentials");
    EXPECT_EQ(Records().size(), 3u);
  }
  auto recs = Records();
  ASSERT_EQ(recs.size(), 4u);
  EXPECT_EQ(recs[3].detail(),
            "2 unauthenticated calls from ipv4:10.1.2.3 in the last minute (CancelJob 1; the first is recorded on its "
            "own)");
}

TEST_F(UnauthenticatedAuditTest, PeersPastTheLimitShareOneRecord) {
  UnauthenticatedAudit audit(store_.get(), &clock_, 60'000, 2);
  for (int round = 0; round < 3; ++round) {
    for (int p = 0; p < 10; ++p) audit.Refused("ipv6:[fd00::" + std::to_string(p) + "]:443", "SubmitJob", "x");
  }
  // Two peers and "other peers" recorded at once; the rest counted.
  EXPECT_EQ(Records().size(), 3u);
  clock_.Advance(60'000);
  audit.Flush();
  auto recs = Records();
  ASSERT_EQ(recs.size(), 6u);
  EXPECT_EQ(recs[5].detail(),
            "24 unauthenticated calls from other peers in the last minute (SubmitJob 23; the first is recorded on its "
            "own)");
}

TEST(UnauthenticatedAuditPeerKey, DropsThePort) {
  EXPECT_EQ(UnauthenticatedAudit::PeerKey("ipv4:10.1.2.3:5123"), "ipv4:10.1.2.3");
  EXPECT_EQ(UnauthenticatedAudit::PeerKey("ipv6:[::1]:5123"), "ipv6:[::1]");
  EXPECT_EQ(UnauthenticatedAudit::PeerKey("ipv6:%5B::1%5D:5123"), "ipv6:%5B::1%5D:5123");
  EXPECT_EQ(UnauthenticatedAudit::PeerKey("fd:112"), "fd:112");
}

}  // namespace
}  // namespace ftd::server

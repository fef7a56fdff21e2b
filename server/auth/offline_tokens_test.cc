#include "server/auth/offline_tokens.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>

namespace ftd::server {
namespace {

TEST(OfflineTokens, CreateListRevokeAndAudit) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / ("offline_tokens_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto store = AuthStore::Open((dir / "auth.db").string());
  ASSERT_TRUE(store.ok()) << store.status();
  const int64_t now = 1'700'000'000'000;
  std::ostringstream out, err;
  TokenCommand c;
  c.verb = TokenCommand::Verb::kCreate;
  c.user = "alice";
  c.role = "admin";
  c.ttl_s = 3600;
  ASSERT_TRUE(RunTokenCommand(store->get(), c, "root", now, out, err).ok()) << err.str();
  const std::string bearer = out.str().substr(0, out.str().find('\n'));
  auto verified = (*store)->Verify(bearer, now + 1000);
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->user(), "alice");
  EXPECT_EQ(verified->role(), ftd::v1::ROLE_ADMIN);
  EXPECT_EQ(verified->expires_unix_ms(), now + 3600'000);
  EXPECT_NE(err.str().find("shown only now"), std::string::npos) << err.str();

  c = TokenCommand{};
  c.verb = TokenCommand::Verb::kList;
  out.str("");
  ASSERT_TRUE(RunTokenCommand(store->get(), c, "root", now, out, err).ok());
  EXPECT_NE(out.str().find(verified->id() + " alice"), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find(bearer.substr(bearer.rfind('_') + 1)), std::string::npos) << "a list shows no secret";

  c.verb = TokenCommand::Verb::kRevoke;
  c.id = verified->id();
  ASSERT_TRUE(RunTokenCommand(store->get(), c, "root", now + 2000, out, err).ok());
  EXPECT_EQ((*store)->Verify(bearer, now + 3000).status().code(), absl::StatusCode::kUnauthenticated);
  c.id = "000000000000";
  EXPECT_EQ(RunTokenCommand(store->get(), c, "root", now, out, err).code(), absl::StatusCode::kNotFound);

  c = TokenCommand{};
  c.verb = TokenCommand::Verb::kCreate;
  c.user = "Not A User";
  EXPECT_EQ(RunTokenCommand(store->get(), c, "root", now, out, err).code(), absl::StatusCode::kInvalidArgument);

  auto audit = (*store)->ListAudit({});
  ASSERT_TRUE(audit.ok());
  ASSERT_EQ(audit->records_size(), 2);
  EXPECT_EQ(audit->records(0).action(), "RevokeToken");
  EXPECT_EQ(audit->records(1).action(), "CreateToken");
  EXPECT_EQ(audit->records(1).user(), "root");
  EXPECT_EQ(audit->records(1).target(), verified->id());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ftd::server

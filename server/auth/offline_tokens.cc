#include "server/auth/offline_tokens.h"

#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace ftd::server {
namespace {

std::string Utc(int64_t unix_ms) {
  return unix_ms == 0 ? "-" : absl::FormatTime("%Y-%m-%d %H:%M", absl::FromUnixMillis(unix_ms), absl::UTCTimeZone());
}

const char* Role(ftd::v1::Role r) { return r == ftd::v1::ROLE_ADMIN ? "admin" : "user"; }

void Audit(AuthStore* store, const char* action, const std::string& by, const std::string& target,
           const std::string& detail, int64_t now_ms, std::ostream& err) {
  ftd::v1::AuditRecord r;
  r.set_unix_ms(now_ms);
  r.set_user(by);
  r.set_role(ftd::v1::ROLE_ADMIN);
  r.set_via("ftd token (offline, on auth.db)");
  r.set_peer("local");
  r.set_action(action);
  r.set_target(target);
  r.set_detail(detail);
  r.set_code("OK");
  if (auto st = store->Audit(std::move(r)); !st.ok()) err << "ftd token: audit log: " << st.message() << "\n";
}

}  // namespace

absl::Status RunTokenCommand(AuthStore* store, const TokenCommand& c, const std::string& by, int64_t now_ms,
                             std::ostream& out, std::ostream& err) {
  switch (c.verb) {
    case TokenCommand::Verb::kCreate: {
      ftd::v1::CreateTokenRequest req;
      req.set_user(c.user);
      req.set_role(c.role == "admin" ? ftd::v1::ROLE_ADMIN : ftd::v1::ROLE_USER);
      req.set_ttl_seconds(c.ttl_s);
      req.set_description(c.description);
      auto r = store->CreateToken(req, by, now_ms);
      if (!r.ok()) return r.status();
      Audit(store, "CreateToken", by, r->token.id(), absl::StrFormat("user=%s role=%s", c.user, Role(req.role())),
            now_ms, err);
      err << "token " << r->token.id() << " for " << r->token.user() << " (" << Role(r->token.role()) << "), expires "
          << Utc(r->token.expires_unix_ms()) << " UTC; the secret below is shown only now: store it in a file of mode "
          << "0600" << std::endl;
      out << r->bearer << std::endl;
      return absl::OkStatus();
    }
    case TokenCommand::Verb::kList: {
      auto tokens = store->ListTokens(c.user, c.all, now_ms);
      if (!tokens.ok()) return tokens.status();
      out << absl::StrFormat("%-12s %-16s %-5s %-16s %-16s %s\n", "ID", "USER", "ROLE", "EXPIRES (UTC)",
                             "REVOKED (UTC)", "DESCRIPTION");
      for (const auto& t : *tokens) {
        out << absl::StrFormat("%-12s %-16s %-5s %-16s %-16s %s\n", t.id(), t.user(), Role(t.role()),
                               Utc(t.expires_unix_ms()), Utc(t.revoked_unix_ms()), t.description());
      }
      return absl::OkStatus();
    }
    case TokenCommand::Verb::kRevoke: {
      auto t = store->RevokeToken(c.id, now_ms);
      if (!t.ok()) return t.status();
      Audit(store, "RevokeToken", by, t->id(), "", now_ms, err);
      out << "token " << t->id() << " of " << t->user() << " revoked at " << Utc(t->revoked_unix_ms()) << " UTC"
          << std::endl;
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

}  // namespace ftd::server

// ftctl whoami
// ftctl admin token create USER [--role user|admin] [--ttl 90d] [--description TEXT]
// ftctl admin token list [--user U] [--all] [-o table|json]
// ftctl admin token revoke ID
// ftctl admin audit [--limit N] [--user U] [--action A] [-o table|json]
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/commands.h"
#include "client/render.h"
#include "google/protobuf/util/json_util.h"

namespace ftd::client {

namespace {

std::string RoleName(ftd::v1::Role r) { return r == ftd::v1::ROLE_ADMIN ? "admin" : "user"; }

std::string When(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms), absl::UTCTimeZone());
}

// "90d", "12h", "30m", "3600s" or "3600" -> seconds.
absl::StatusOr<int64_t> ParseTtl(const std::string& s) {
  if (s.empty()) return 0;
  int64_t unit = 1;
  std::string num = s;
  switch (s.back()) {
    case 'd': unit = 86400; num.pop_back(); break;
    case 'h': unit = 3600; num.pop_back(); break;
    case 'm': unit = 60; num.pop_back(); break;
    case 's': num.pop_back(); break;
    default: break;
  }
  int64_t n = 0;
  if (!absl::SimpleAtoi(num, &n) || n <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--ttl ", s, " is not a duration such as 90d, 12h, 30m or 3600s"));
  }
  return n * unit;
}

template <typename M>
std::string Json(const M& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

}  // namespace

Command AddWhoAmI(CLI::App& app) {
  auto* c = app.add_subcommand("whoami", "Show who ftd takes you for, and how it knows");
  return {c, [](Context& ctx) {
            auto id = ctx.client().WhoAmI();
            if (!id.ok()) return Fail(id.status());
            std::cout << Shown(id->user()) << " (" << RoleName(id->role()) << ") via " << Shown(id->via()) << ", from "
                      << Shown(id->peer()) << std::endl;
            return kExitOk;
          }};
}

Command AddAdmin(CLI::App& app) {
  auto* admin = app.add_subcommand("admin", "Tokens and the audit log (admins)");
  admin->require_subcommand(1);
  auto* token = admin->add_subcommand("token", "Create, list and revoke bearer tokens");
  token->require_subcommand(1);

  struct Flags {
    std::string user, role = "user", ttl, description, id, action, output = "table";
    bool all = false;
    int limit = 50;
  };
  auto f = std::make_shared<Flags>();
  auto* create = token->add_subcommand("create", "Issue a token for USER; its secret is printed once, on stdout");
  create->add_option("user", f->user, "the user the token authenticates")->required();
  create->add_option("--role", f->role, "user or admin")->check(OneOf({"user", "admin"}))->capture_default_str();
  create->add_option("--ttl", f->ttl, "lifetime: 90d, 12h, 30m, 3600s (default 90d)");
  create->add_option("--description", f->description, "what the token is for (at most 200 characters)");
  auto* list = token->add_subcommand("list", "List tokens (never their secrets)");
  list->add_option("--user", f->user, "only this user's");
  list->add_flag("--all", f->all, "also revoked and expired tokens");
  list->add_option("-o,--output", f->output, "table or json")->check(OneOf({"table", "json"}));
  auto* revoke = token->add_subcommand("revoke", "Revoke a token by its id (ftctl admin token list)");
  revoke->add_option("id", f->id, "token id")->required();
  auto* audit = admin->add_subcommand("audit", "Show the audit log of mutating calls, newest first");
  audit->add_option("--limit", f->limit, "records (1..1000)")->check(CLI::Range(1, 1000))->capture_default_str();
  audit->add_option("--user", f->user, "only this user's calls");
  audit->add_option("--action", f->action, "only this action (SubmitJob, CancelJob, CreateToken, ...)");
  audit->add_option("-o,--output", f->output, "table or json")->check(OneOf({"table", "json"}));

  return {admin, [=](Context& ctx) {
            if (create->parsed()) {
              auto ttl = ParseTtl(f->ttl);
              if (!ttl.ok()) return Usage(std::string(ttl.status().message()));
              ftd::v1::CreateTokenRequest req;
              req.set_user(f->user);
              req.set_role(f->role == "admin" ? ftd::v1::ROLE_ADMIN : ftd::v1::ROLE_USER);
              req.set_ttl_seconds(*ttl);
              req.set_description(f->description);
              auto r = ctx.client().CreateToken(req);
              if (!r.ok()) return Fail(r.status());
              std::cerr << "token " << r->token().id() << " for " << r->token().user() << " ("
                        << RoleName(r->token().role()) << "), expires " << When(r->token().expires_unix_ms())
                        << " UTC; the secret below is shown only now: store it in a file of mode 0600" << std::endl;
              std::cout << r->secret() << std::endl;
              return kExitOk;
            }
            if (list->parsed()) {
              ftd::v1::ListTokensRequest req;
              req.set_user(f->user);
              req.set_include_inactive(f->all);
              auto r = ctx.client().ListTokens(req);
              if (!r.ok()) return Fail(r.status());
              if (f->output == "json") {
                std::cout << Json(*r) << std::endl;
                return kExitOk;
              }
              std::vector<std::vector<std::string>> rows = {
                  {"ID", "USER", "ROLE", "CREATED", "EXPIRES", "REVOKED", "DESCRIPTION"}};
              for (const auto& t : r->tokens()) {
                rows.push_back({Shown(t.id()), Shown(t.user()), RoleName(t.role()), When(t.created_unix_ms()),
                                When(t.expires_unix_ms()), When(t.revoked_unix_ms()), Shown(t.description())});
              }
              std::cout << Table(rows);
              return kExitOk;
            }
            if (revoke->parsed()) {
              auto t = ctx.client().RevokeToken(f->id);
              if (!t.ok()) return Fail(t.status());
              std::cout << "token " << Shown(t->id()) << " of " << Shown(t->user()) << " revoked at "
                        << When(t->revoked_unix_ms())
                        << " UTC" << std::endl;
              return kExitOk;
            }
            ftd::v1::ListAuditRequest req;
            req.set_limit(f->limit);
            req.set_user(f->user);
            req.set_action(f->action);
            auto r = ctx.client().ListAudit(req);
            if (!r.ok()) return Fail(r.status());
            if (f->output == "json") {
              std::cout << Json(*r) << std::endl;
              return kExitOk;
            }
            // Columns as wide as their widest cell: token ids (12 characters), long user names and
            // action names do not push the rest out of line.
            std::vector<std::vector<std::string>> rows = {
                {"SEQ", "TIME (UTC)", "USER", "ACTION", "TARGET", "OUTCOME", "FROM / DETAIL"}};
            for (const auto& a : r->records()) {
              rows.push_back({absl::StrCat(a.seq()), When(a.unix_ms()), a.user().empty() ? "-" : Shown(a.user()),
                              Shown(a.action()), a.target().empty() ? "-" : Shown(a.target()), Shown(a.code()),
                              absl::StrCat(Shown(a.peer()), " (", Shown(a.via()), ") ", Shown(a.detail()),
                                           a.message().empty() ? "" : ": " + Shown(a.message()))});
            }
            std::cout << Table(rows);
            return kExitOk;
          }};
}

}  // namespace ftd::client

// Who a call comes from (Authenticator, auth.h): a bearer token checked against the store, else a
// verified client certificate's common name, else the local peer's uid; and a local uid's name.
#include "server/auth/auth.h"

#include <pwd.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ftd::server {

std::string LocalUserName(uid_t uid) {
  struct passwd pw {};
  struct passwd* out = nullptr;
  char buf[4096];
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &out) == 0 && out != nullptr) return out->pw_name;
  return absl::StrCat("uid:", uid);
}

Identity Authenticator::Local(const ucred& c) const {
  Identity id;
  id.set_user(LocalUserName(c.uid));
  const bool admin = c.uid == 0 || c.uid == cfg_.daemon_uid || cfg_.admins.count(id.user()) > 0;
  id.set_role(admin ? ftd::v1::ROLE_ADMIN : ftd::v1::ROLE_USER);
  id.set_via(absl::StrCat("unix socket uid ", c.uid));
  id.set_peer(absl::StrCat("local uid ", c.uid, " pid ", c.pid));
  id.set_local_uid(c.uid);
  return id;
}

absl::StatusOr<Identity> Authenticator::Authenticate(const Presented& p) const {
  if (p.authorization) {
    const std::string kBearer = "Bearer ";
    if (!absl::StartsWith(*p.authorization, kBearer)) {
      return absl::UnauthenticatedError("the authorization header is not \"Bearer <token>\"");
    }
    auto t = tokens_->Verify(p.authorization->substr(kBearer.size()), clock_->UnixMs());
    if (!t.ok()) return t.status();
    Identity id;
    id.set_user(t->user());
    id.set_role(t->role());
    id.set_via(absl::StrCat("token ", t->id()));
    id.set_peer(p.peer);
    return id;
  }
  if (!p.cert_cn.empty()) {
    Identity id;
    if (auto st = ValidateUserName(p.cert_cn, "the client certificate's common name"); !st.ok()) {
      return absl::UnauthenticatedError(st.message());
    }
    id.set_user(p.cert_cn);
    id.set_role(cfg_.admins.count(p.cert_cn) > 0 ? ftd::v1::ROLE_ADMIN : ftd::v1::ROLE_USER);
    id.set_via(absl::StrCat("client certificate CN=", p.cert_cn));
    id.set_peer(p.peer);
    return id;
  }
  if (local_ != nullptr) {
    if (auto c = local_->PeerOf(p.peer)) return Local(*c);
  }
  return absl::UnauthenticatedError(
      "no credentials: over TCP, present a token (token_file in the ftctl context, or $FTD_TOKEN_FILE) or a "
      "client certificate; on the workstation, use ftd's unix socket");
}

}  // namespace ftd::server

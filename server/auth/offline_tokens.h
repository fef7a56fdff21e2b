// `ftd token create|list|revoke --data-dir DIR`: tokens managed on the data directory's auth.db
// directly, so that an admin can issue the first token, or revoke a leaked one, with the daemon
// stopped (or running: SQLite serialises the writes, and the daemon reads a token's record at every
// call, so a revoke takes effect at the next call). Each change is written to the audit log as the
// RPCs' are, with the local user who made it.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "server/auth/auth_store.h"

namespace ftd::server {

struct TokenCommand {
  enum class Verb { kCreate, kList, kRevoke };
  Verb verb = Verb::kList;
  std::string user;         // create: whom the token authenticates; list: only theirs (empty: all)
  std::string role = "user";  // create: user or admin
  int64_t ttl_s = 0;        // create: lifetime (0: the default, 90 days)
  std::string description;  // create
  std::string id;           // revoke
  bool all = false;         // list: also revoked and expired tokens
};

// Runs `c` on `store` for local user `by`: create prints the bearer secret alone on `out` (and what
// it is on `err`), list a table, revoke one line. Errors name the field, as the RPCs' do.
absl::Status RunTokenCommand(AuthStore* store, const TokenCommand& c, const std::string& by, int64_t now_ms,
                             std::ostream& out, std::ostream& err);

}  // namespace ftd::server

// Tokens and the audit log, in a SQLite file of their own (auth.db in the data directory, mode 0600),
// apart from the job store: its schema changes on its own, and the job database may be copied for a
// bug report without its credentials.
//
// A token is "ftd_<id>_<secret>": <id> is 12 hex digits, public (lists and the audit log name it);
// <secret> is 32 random bytes in hex. Only SHA-256(secret) is stored; Verify compares hashes in
// constant time. Nothing here logs or returns a secret except CreateToken, once.
//
// The audit log is append-only: one row per mutating call, committed (synchronous=FULL) before the
// call's answer leaves the daemon.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ftd/v1/admin.pb.h"

namespace ftd::server {

// Limits of CreateTokenRequest (proto/ftd/v1/admin.proto).
inline constexpr int64_t kDefaultTokenTtlS = 90LL * 24 * 3600;
inline constexpr int64_t kMaxTokenTtlS = 10LL * 365 * 24 * 3600;
inline constexpr size_t kMaxTokenDescription = 200;

// OK for a user name ftd accepts: [a-z_][a-z0-9_.-]*, at most 64 characters; else INVALID_ARGUMENT
// naming `field`.
absl::Status ValidateUserName(const std::string& name, const std::string& field);

class AuthStore {
 public:
  static absl::StatusOr<std::unique_ptr<AuthStore>> Open(const std::string& path);
  ~AuthStore();
  AuthStore(const AuthStore&) = delete;
  AuthStore& operator=(const AuthStore&) = delete;

  struct Created {
    ftd::v1::Token token;
    std::string bearer;  // "ftd_<id>_<secret>": the only copy of the secret
  };
  // INVALID_ARGUMENT naming the field for a bad user, ttl or description.
  absl::StatusOr<Created> CreateToken(const ftd::v1::CreateTokenRequest& req, const std::string& created_by,
                                      int64_t now_ms);
  // Newest first; `include_inactive` adds revoked and expired tokens.
  absl::StatusOr<std::vector<ftd::v1::Token>> ListTokens(const std::string& user, bool include_inactive,
                                                         int64_t now_ms);
  // NOT_FOUND for an unknown id; revoking twice keeps the first time.
  absl::StatusOr<ftd::v1::Token> RevokeToken(const std::string& id, int64_t now_ms);
  // The token a bearer string proves, or UNAUTHENTICATED saying why (malformed, unknown, revoked,
  // expired) without repeating the secret.
  absl::StatusOr<ftd::v1::Token> Verify(const std::string& bearer, int64_t now_ms);

  // Appends `r` (its seq assigned here) durably.
  absl::Status Audit(ftd::v1::AuditRecord r);
  // A mutating call's record in two steps: before the call changes anything, its record as it
  // stands (who, what; the outcome unknown), whose seq is returned; the call goes ahead only if
  // that was written. Then its outcome, replacing that record, durably.
  absl::StatusOr<int64_t> BeginAudit(ftd::v1::AuditRecord r);
  absl::Status FinishAudit(int64_t seq, ftd::v1::AuditRecord r);
  absl::StatusOr<ftd::v1::ListAuditResponse> ListAudit(const ftd::v1::ListAuditRequest& req);

 private:
  AuthStore() = default;
  absl::Status Error(const char* what) const;
  absl::Status Exec(const char* sql);

  std::mutex mu_;
  sqlite3* db_ = nullptr;
  std::string path_;
};

}  // namespace ftd::server

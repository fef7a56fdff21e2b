#include "server/auth/auth_store.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/common/filesystem_info.h"
#include "server/common/sqlite_stmt.h"
#include "spec/text.h"

namespace ftd::server {

namespace {

constexpr size_t kIdBytes = 6, kSecretBytes = 32;

absl::StatusOr<std::string> RandomHex(size_t n) {
  std::string buf(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(buf.data()), static_cast<int>(n)) != 1) {
    return absl::InternalError("the system random number generator failed");
  }
  return absl::BytesToHexString(buf);
}

std::string Sha256(const std::string& s) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(s.data(), s.size(), md, &len, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(md), len);
}

bool IsHex(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

ftd::v1::Token TokenFrom(Stmt& q) {
  ftd::v1::Token t;
  t.set_id(q.Text(0));
  t.set_user(q.Text(1));
  t.set_role(static_cast<ftd::v1::Role>(q.Int(2)));
  t.set_created_unix_ms(q.Int(3));
  t.set_expires_unix_ms(q.Int(4));
  t.set_revoked_unix_ms(q.Int(5));
  t.set_created_by(q.Text(6));
  t.set_description(q.Text(7));
  return t;
}

constexpr const char* kTokenColumns =
    "id, user, role, created_unix_ms, expires_unix_ms, revoked_unix_ms, created_by, description";

}  // namespace

absl::Status ValidateUserName(const std::string& name, const std::string& field) {
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(field, " ", why, " (a user name: [a-z_][a-z0-9_.-]*, at most 64 characters)"));
  };
  if (name.empty()) return bad("is empty");
  if (name.size() > 64) return bad(absl::StrCat("has ", name.size(), " characters"));
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || c == '_' || (i > 0 && ((c >= '0' && c <= '9') || c == '.' || c == '-'));
    if (!ok) return bad(absl::StrCat("has a character not allowed at position ", i + 1));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<AuthStore>> AuthStore::Open(const std::string& path) {
  // Created 0600 before SQLite opens it: it holds token hashes and who did what.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  ::fchmod(fd, 0600);
  ::close(fd);
  std::unique_ptr<AuthStore> s(new AuthStore());
  s->path_ = path;
  if (sqlite3_open_v2(path.c_str(), &s->db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, nullptr) != SQLITE_OK) {
    return s->Error("open");
  }
  sqlite3_busy_timeout(s->db_, 5000);
  for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL",
                          "CREATE TABLE IF NOT EXISTS tokens(id TEXT PRIMARY KEY, hash BLOB NOT NULL,"
                          " user TEXT NOT NULL, role INTEGER NOT NULL, created_unix_ms INTEGER NOT NULL,"
                          " expires_unix_ms INTEGER NOT NULL, revoked_unix_ms INTEGER NOT NULL DEFAULT 0,"
                          " created_by TEXT NOT NULL, description TEXT NOT NULL)",
                          "CREATE TABLE IF NOT EXISTS audit(seq INTEGER PRIMARY KEY AUTOINCREMENT,"
                          " unix_ms INTEGER NOT NULL, user TEXT NOT NULL, action TEXT NOT NULL, record BLOB NOT NULL)",
                          "CREATE INDEX IF NOT EXISTS audit_by_user ON audit(user, seq)",
                          "CREATE INDEX IF NOT EXISTS audit_by_action ON audit(action, seq)"}) {
    if (auto st = s->Exec(sql); !st.ok()) return st;
  }
  return s;
}

AuthStore::~AuthStore() { sqlite3_close_v2(db_); }

absl::Status AuthStore::Error(const char* what) const {
  const std::string msg = absl::StrCat("database ", path_, ": ", what, ": ", sqlite3_errmsg(db_));
  const int primary = sqlite3_extended_errcode(db_) & 0xff;
  const int sys = sqlite3_system_errno(db_);
  if (primary == SQLITE_FULL || (primary == SQLITE_IOERR && (sys == ENOSPC || sys == EDQUOT))) {
    const std::string dir = std::filesystem::path(path_).parent_path().string();
    const std::string fs = DescribeFilesystem(dir);
    return absl::ResourceExhaustedError(absl::StrCat(
        "the disk is full: no space left for ftd's data directory ", dir, fs.empty() ? "" : " (" + fs + ")",
        "; nothing of this write was kept (", what, ": ", sqlite3_errmsg(db_),
        "). Free space on that disk, or move the data directory to a larger one, then retry"));
  }
  return absl::InternalError(msg);
}

absl::Status AuthStore::Exec(const char* sql) {
  if (sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) != SQLITE_OK) return Error(sql);
  return absl::OkStatus();
}

absl::StatusOr<AuthStore::Created> AuthStore::CreateToken(const ftd::v1::CreateTokenRequest& req,
                                                          const std::string& created_by, int64_t now_ms) {
  if (auto st = ValidateUserName(req.user(), "user"); !st.ok()) return st;
  if (req.ttl_seconds() < 0 || req.ttl_seconds() > kMaxTokenTtlS) {
    return absl::InvalidArgumentError(absl::StrCat("ttl_seconds must be 0 (90 days) to ", kMaxTokenTtlS,
                                                   " (10 years) (got ", req.ttl_seconds(), ")"));
  }
  if (req.description().size() > kMaxTokenDescription) {
    return absl::InvalidArgumentError(absl::StrCat("description has ", req.description().size(),
                                                   " bytes; at most ", kMaxTokenDescription));
  }
  if (auto st = spec::CheckNoControlChars(req.description(), "description"); !st.ok()) return st;
  if (req.role() != ftd::v1::ROLE_UNSPECIFIED && req.role() != ftd::v1::ROLE_USER && req.role() != ftd::v1::ROLE_ADMIN) {
    return absl::InvalidArgumentError(absl::StrCat("role ", static_cast<int>(req.role()), " is not a role (user or admin)"));
  }
  auto id = RandomHex(kIdBytes);
  auto secret = RandomHex(kSecretBytes);
  if (!id.ok()) return id.status();
  if (!secret.ok()) return secret.status();
  ftd::v1::Token t;
  t.set_id(*id);
  t.set_user(req.user());
  t.set_role(req.role() == ftd::v1::ROLE_UNSPECIFIED ? ftd::v1::ROLE_USER : req.role());
  t.set_created_unix_ms(now_ms);
  t.set_expires_unix_ms(now_ms + 1000 * (req.ttl_seconds() == 0 ? kDefaultTokenTtlS : req.ttl_seconds()));
  t.set_created_by(created_by);
  t.set_description(req.description());
  std::lock_guard<std::mutex> l(mu_);
  Stmt i(db_, "INSERT INTO tokens(id, hash, user, role, created_unix_ms, expires_unix_ms, created_by, description)"
              " VALUES(?, ?, ?, ?, ?, ?, ?, ?)");
  i.Bind(1, t.id()).BindBlob(2, Sha256(*secret)).Bind(3, t.user()).Bind(4, static_cast<int64_t>(t.role()));
  i.Bind(5, t.created_unix_ms()).Bind(6, t.expires_unix_ms()).Bind(7, t.created_by()).Bind(8, t.description());
  if (i.Step() != SQLITE_DONE) return Error("insert token");
  return Created{t, absl::StrCat("ftd_", t.id(), "_", *secret)};
}

absl::StatusOr<std::vector<ftd::v1::Token>> AuthStore::ListTokens(const std::string& user, bool include_inactive,
                                                                  int64_t now_ms) {
  std::lock_guard<std::mutex> l(mu_);
  const std::string sql = absl::StrCat("SELECT ", kTokenColumns, " FROM tokens WHERE (?1 = '' OR user = ?1) AND",
                                       " (?2 OR (revoked_unix_ms = 0 AND expires_unix_ms > ?3))",
                                       " ORDER BY created_unix_ms DESC, id");
  Stmt q(db_, sql.c_str());
  q.Bind(1, user).Bind(2, include_inactive ? 1 : 0).Bind(3, now_ms);
  std::vector<ftd::v1::Token> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) out.push_back(TokenFrom(q));
  if (rc != SQLITE_DONE) return Error("list tokens");
  return out;
}

absl::StatusOr<ftd::v1::Token> AuthStore::RevokeToken(const std::string& id, int64_t now_ms) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt u(db_, "UPDATE tokens SET revoked_unix_ms = ? WHERE id = ? AND revoked_unix_ms = 0");
  u.Bind(1, now_ms).Bind(2, id);
  if (u.Step() != SQLITE_DONE) return Error("revoke token");
  const std::string sql = absl::StrCat("SELECT ", kTokenColumns, " FROM tokens WHERE id = ?");
  Stmt q(db_, sql.c_str());
  q.Bind(1, id);
  if (q.Step() != SQLITE_ROW) {
    return absl::NotFoundError(absl::StrCat("no token with id \"", id, "\" (ftctl admin token list shows them)"));
  }
  return TokenFrom(q);
}

absl::StatusOr<ftd::v1::Token> AuthStore::Verify(const std::string& bearer, int64_t now_ms) {
  const std::vector<std::string> parts = absl::StrSplit(bearer, '_');
  if (parts.size() != 3 || parts[0] != "ftd" || parts[1].size() != 2 * kIdBytes ||
      parts[2].size() != 2 * kSecretBytes || !IsHex(parts[1]) || !IsHex(parts[2])) {
    return absl::UnauthenticatedError("the bearer token is not an ftd token (ftd_<id>_<secret>, as ftctl admin token "
                                      "create prints it)");
  }
  std::lock_guard<std::mutex> l(mu_);
  const std::string sql = absl::StrCat("SELECT ", kTokenColumns, ", hash FROM tokens WHERE id = ?");
  Stmt q(db_, sql.c_str());
  q.Bind(1, parts[1]);
  const std::string hash = Sha256(parts[2]);
  if (q.Step() != SQLITE_ROW) return absl::UnauthenticatedError(absl::StrCat("token ", parts[1], " is unknown"));
  const std::string stored = q.Blob(8);
  if (stored.size() != hash.size() || CRYPTO_memcmp(stored.data(), hash.data(), hash.size()) != 0) {
    return absl::UnauthenticatedError(absl::StrCat("token ", parts[1], " is unknown"));
  }
  ftd::v1::Token t = TokenFrom(q);
  if (t.revoked_unix_ms() != 0) {
    return absl::UnauthenticatedError(absl::StrCat("token ", t.id(), " was revoked; ask an admin for a new one"));
  }
  if (t.expires_unix_ms() <= now_ms) {
    return absl::UnauthenticatedError(absl::StrCat("token ", t.id(), " has expired; ask an admin for a new one"));
  }
  return t;
}

absl::Status AuthStore::Audit(ftd::v1::AuditRecord r) {
  r.set_seq(0);  // the row's key; ListAudit fills it in
  std::lock_guard<std::mutex> l(mu_);
  Stmt i(db_, "INSERT INTO audit(unix_ms, user, action, record) VALUES(?, ?, ?, ?)");
  i.Bind(1, r.unix_ms()).Bind(2, r.user()).Bind(3, r.action()).BindBlob(4, r.SerializeAsString());
  if (i.Step() != SQLITE_DONE) return Error("append audit record");
  return absl::OkStatus();
}

absl::StatusOr<int64_t> AuthStore::BeginAudit(ftd::v1::AuditRecord r) {
  r.set_seq(0);
  std::lock_guard<std::mutex> l(mu_);
  // Not synced on its own (WAL, synchronous=NORMAL for this commit): the FinishAudit that follows
  // syncs the log with it, and a crash between the two leaves what a crash before the call did.
  if (auto st = Exec("PRAGMA synchronous=NORMAL"); !st.ok()) return st;
  Stmt i(db_, "INSERT INTO audit(unix_ms, user, action, record) VALUES(?, ?, ?, ?)");
  i.Bind(1, r.unix_ms()).Bind(2, r.user()).Bind(3, r.action()).BindBlob(4, r.SerializeAsString());
  const bool done = i.Step() == SQLITE_DONE;
  absl::Status st = done ? absl::OkStatus() : Error("append audit record");
  (void)Exec("PRAGMA synchronous=FULL");
  if (!st.ok()) return st;
  return static_cast<int64_t>(sqlite3_last_insert_rowid(db_));
}

absl::Status AuthStore::FinishAudit(int64_t seq, ftd::v1::AuditRecord r) {
  r.set_seq(0);
  std::lock_guard<std::mutex> l(mu_);
  Stmt u(db_, "UPDATE audit SET unix_ms = ?, user = ?, action = ?, record = ? WHERE seq = ?");
  u.Bind(1, r.unix_ms()).Bind(2, r.user()).Bind(3, r.action()).BindBlob(4, r.SerializeAsString()).Bind(5, seq);
  if (u.Step() != SQLITE_DONE) return Error("record the outcome in the audit log");
  return absl::OkStatus();
}

absl::StatusOr<ftd::v1::ListAuditResponse> AuthStore::ListAudit(const ftd::v1::ListAuditRequest& req) {
  if (req.limit() < 0 || req.limit() > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("limit must be 0 (50) to 1000 (got ", req.limit(), ")"));
  }
  const int limit = req.limit() == 0 ? 50 : req.limit();
  std::lock_guard<std::mutex> l(mu_);
  Stmt q(db_, "SELECT seq, record FROM audit WHERE (?1 = 0 OR seq < ?1) AND (?2 = '' OR user = ?2)"
              " AND (?3 = '' OR action = ?3) ORDER BY seq DESC LIMIT ?4");
  q.Bind(1, req.before_seq()).Bind(2, req.user()).Bind(3, req.action()).Bind(4, static_cast<int64_t>(limit) + 1);
  ftd::v1::ListAuditResponse resp;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    if (resp.records_size() == limit) {
      resp.set_next_before_seq(resp.records(limit - 1).seq());
      break;
    }
    ftd::v1::AuditRecord r;
    if (!r.ParseFromString(q.Blob(1))) return absl::DataLossError(absl::StrCat("audit record ", q.Int(0), " is corrupt"));
    r.set_seq(q.Int(0));
    *resp.add_records() = std::move(r);
  }
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) return Error("list audit");
  return resp;
}

}  // namespace ftd::server

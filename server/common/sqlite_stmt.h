// A prepared SQLite statement with its lifetime tied to scope, shared by the daemon's SQLite files
// (store.cc: jobs; auth_store.cc: tokens and the audit log).
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <string>

namespace ftd::server {

class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool ok() const { return rc_ == SQLITE_OK; }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt& BindDouble(int i, double v) {
    sqlite3_bind_double(s_, i, v);
    return *this;
  }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindBlob(int i, const std::string& v) {
    sqlite3_bind_blob(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindNull(int i) {
    sqlite3_bind_null(s_, i);
    return *this;
  }
  int Step() { return rc_ = sqlite3_step(s_); }
  sqlite3_stmt* raw() { return s_; }
  int64_t Int(int col) const { return sqlite3_column_int64(s_, col); }
  double Double(int col) const { return sqlite3_column_double(s_, col); }
  std::string Blob(int col) const {
    const void* p = sqlite3_column_blob(s_, col);
    return p == nullptr ? std::string() : std::string(static_cast<const char*>(p), sqlite3_column_bytes(s_, col));
  }
  std::string Text(int col) const {
    const unsigned char* p = sqlite3_column_text(s_, col);
    return p == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(p));
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* s_ = nullptr;
  int rc_;
};

}  // namespace ftd::server

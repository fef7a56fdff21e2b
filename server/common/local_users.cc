#include "server/common/local_users.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace ftd::server {

namespace {

WorkerUser FromPasswd(const passwd& pw) {
  WorkerUser u{pw.pw_name, pw.pw_uid, pw.pw_gid, {}, pw.pw_dir != nullptr ? pw.pw_dir : "/"};
  int n = 64;
  u.groups.resize(n);
  while (::getgrouplist(pw.pw_name, pw.pw_gid, u.groups.data(), &n) < 0) u.groups.resize(n);
  u.groups.resize(n);
  return u;
}

}  // namespace

absl::StatusOr<WorkerUser> LookUpWorkerUser(const std::string& name) {
  if (::geteuid() != 0) {
    return absl::FailedPreconditionError(absl::StrCat("--worker-user ", name, " needs ftd to run as root to switch "
                                                      "its workers to that user (ftd runs as uid ", ::geteuid(),
                                                      "); start ftd as root, or drop --worker-user"));
  }
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  const int rc = ::getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &found);
  if (found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--worker-user ", name, ": no such user",
                                                   rc != 0 ? absl::StrCat(" (", std::strerror(rc), ")") : "",
                                                   "; create a service user for the workers (useradd --system)"));
  }
  if (pw.pw_uid == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--worker-user ", name, " is root: name an unprivileged user"));
  }
  return FromPasswd(pw);
}

absl::StatusOr<WorkerUser> LookUpOwner(uid_t uid) {
  if (uid == 0) return absl::FailedPreconditionError("the job's owner is root: its workers never run as root");
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  const int rc = ::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found);
  if (found == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("the job's owner, uid ", uid, ", is not in the password "
                                                      "database any more",
                                                      rc != 0 ? absl::StrCat(" (", std::strerror(rc), ")") : "",
                                                      ": its workers cannot run as it"));
  }
  return FromPasswd(pw);
}

}  // namespace ftd::server

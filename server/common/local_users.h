// Local users as the password database has them: the user workers run as (ftd --worker-user), and a
// job's local owner (the files it may name, the user its workers run as with --workers-as-owner).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ftd::server {

// The unprivileged user workers run as (ftd --worker-user), as the password database has it.
struct WorkerUser {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // its supplementary groups (its primary one included)
  std::string home;
};

// `name`'s entry. A daemon that is not root cannot switch users: refused, saying so.
absl::StatusOr<WorkerUser> LookUpWorkerUser(const std::string& name);
// The entry of a job owner's uid (--workers-as-owner): FAILED_PRECONDITION for root or a uid the
// password database does not know.
absl::StatusOr<WorkerUser> LookUpOwner(uid_t uid);

}  // namespace ftd::server

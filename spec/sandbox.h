// The file sandbox at submission: which directories a job's paths may lie in, and every path field
// of a spec resolved and confined to them (docs/security.md, "Files").
//
// The admin names a per-user writable root (a pattern such as "/srv/ftd/users/{user}") and shared
// read-only roots ("/srv/models", "/srv/datasets"). A relative path is taken against the user's root;
// `..` and symbolic links are followed (the longest existing prefix is resolved by the kernel, the
// rest lexically, until nothing changes); the resolved path is what the job stores and the worker
// opens (confined again there, at open time: worker/engine/core/fs_util.h). Inputs may lie under any
// root and must exist; outputs (checkpoint.dir, data.cache_dir) only under the user's own root.
// Without roots nothing is confined (the single-user default).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ftd/v1/job_spec.pb.h"

namespace ftd::spec {

// One user's roots, absolute and resolved.
struct Roots {
  std::string writable;               // the user's own root; empty: none
  std::vector<std::string> read_only;  // shared, read-only
};

struct SandboxConfig {
  std::string user_root;                    // pattern with "{user}"; empty: no per-user root
  std::vector<std::string> read_only_roots;  // existing directories

  bool enabled() const { return !user_root.empty() || !read_only_roots.empty(); }
  // Checked once, at the daemon's start: the pattern is absolute and holds {user}; each read-only
  // root exists and is a directory (stored resolved). INVALID_ARGUMENT naming the flag.
  absl::Status Validate();
  // `user`'s roots. INVALID_ARGUMENT for a user name that cannot name a directory.
  absl::StatusOr<Roots> RootsFor(const std::string& user) const;
};

// `path` (absolute) with symbolic links and `..` resolved, as far as it exists; the missing rest
// lexically. PERMISSION_DENIED ("not permitted") when a component cannot be examined.
absl::StatusOr<std::string> ResolvePath(const std::string& path);

// `path` is `root` or lies below it (both resolved).
bool Beneath(const std::string& path, const std::string& root);

// The fields written by a job (the rest are read).
bool IsOutputField(const std::string& dotted);

// Resolves every path field of `spec` against `roots` and stores the result in it:
//   PERMISSION_DENIED "spec.<field>: not permitted: ..." for a path outside the roots it may use;
//   INVALID_ARGUMENT for a relative path with no user root, or a missing input.
absl::Status ConfineSpecPaths(const Roots& roots, ftd::v1::TrainSpec* spec);

}  // namespace ftd::spec

// Confinement of the worker's opens to the job's directories. Torch-free and protobuf-free, below
// the tokenizer and the dataset cache, so that they and the engine's files (worker/engine/core/fs_util.h)
// open through the same roots.
//
// Once set, every open through OpenConfined of an absolute path happens beneath the root directory
// that holds it, through that root's descriptor (opened by ConfineOpens):
// openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS), or where the kernel lacks openat2 (before Linux
// 5.6) a walk that opens each component with O_NOFOLLOW. A symbolic link swapped in after the job
// was submitted cannot lead out: the open fails "not permitted". A path under no root is refused the
// same way. Set once by the worker agent from its assignment (the daemon's roots for the job's
// owner), before the job runs; process-wide, like the umask. Writes go only to writable roots. An
// empty list (the default) confines nothing.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace ftd::data {

struct OpenRoot {
  std::string path;       // absolute, resolved
  bool writable = false;
  bool optional = false;  // a root that cannot be opened (or made) is left out instead of refused
};
absl::Status ConfineOpens(const std::vector<OpenRoot>& roots);
// Whether an error may quote what the file at `path` holds (a token id and its position): when
// nothing is confined (the single-user default, where a job reads whatever the worker may), or when
// the deepest root holding `path` is writable (the job owner's own directory, or the job's). Under a
// read-only root the file may be another user's, and its bytes stay out of messages.
bool MayQuoteContents(const std::string& path);
// For tests: use the O_NOFOLLOW walk even where openat2 exists.
void ForceOpenWalkForTesting(bool force);

// Whether ConfineOpens set any root.
bool Confined();

// ::open(path, flags, mode), beneath the root that holds `path` when confined (a writable one when
// `write`). -1 with errno as the kernel says; EPERM for a path under no root.
int OpenConfined(const std::string& path, int flags, mode_t mode, bool write);

// The message for an open that failed with `err`: "<what>: not permitted: <path> is outside the
// directories this job may read, ..." for what the confinement refused, else "<what>: <verb>
// <path>: <strerror>". An empty `what` leaves the prefix out.
std::string OpenError(std::string_view what, std::string_view verb, const std::string& path, int err, bool write);

// Makes the directory `dir` and its missing parents (0700 under the worker's umask); confined to a
// writable root when ConfineOpens is set, one component at a time. `what` names it in errors.
absl::Status EnsureDirectory(const std::string& dir, std::string_view what);

}  // namespace ftd::data

// Directory trees walked beneath opened directory descriptors, for the daemon (a job's files) and
// the worker (the prepared-dataset cache). Both remove trees that another user may write into (a
// job's directory belongs to its worker's user; a cache directory to whoever made it), who could
// plant or swap in symbolic links between our steps. std::filesystem::remove_all resolves each
// entry's path again from the top, so a directory swapped for a link after it was listed leads the
// removal out of the tree; here each entry is looked at and removed relative to its parent's open
// descriptor (openat O_NOFOLLOW, fstatat AT_SYMLINK_NOFOLLOW, unlinkat), so a link is removed
// itself and never followed. No library offers this walk (Boost's remove_all and
// std::filesystem's are path-based), hence by hand. Torch-free and protobuf-free.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ftd::util {

// Calls `each` with the descriptor of the open directory `fd` (which it takes and closes) and the
// name of each entry but "." and "..", until one returns an error. `path` names `fd` in errors.
absl::Status ForEachEntry(int fd, const std::string& path,
                          const std::function<absl::Status(int dir, const std::string& name)>& each);

// Removes the entry `name` of the open directory `dir` and, when it is a directory (not a link to
// one), everything beneath it; a missing entry is no error. Adds the removed regular files' bytes to
// *bytes. `path` names the entry in errors.
absl::Status RemoveEntryAt(int dir, const std::string& name, const std::string& path, int64_t* bytes);

// Removes `path` and everything under it; returns the bytes freed (0 when it does not exist). `path`
// itself is resolved by name (its parents are trusted); everything beneath it as RemoveEntryAt does.
absl::StatusOr<int64_t> RemoveTree(const std::string& path);

}  // namespace ftd::util

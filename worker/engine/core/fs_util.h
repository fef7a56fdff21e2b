// Files: durable writes (the building blocks of atomic checkpoints), opening inputs that must be
// regular files, and an exclusive lock on a directory. No LibTorch.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "util/unique_fd.h"

namespace ftd::engine {

// An owned file descriptor (closed on destruction).
using Fd = ::ftd::util::Fd;

// Confinement: once set, every open below (OpenRegularFile, ReadRegularFile, EnsureDirectory) of an
// absolute path happens beneath the root directory that holds it, through that root's descriptor
// (opened here): openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS), or where the kernel lacks openat2
// (before Linux 5.6) a walk that opens each component with O_NOFOLLOW. A symbolic link swapped in
// after the job was submitted cannot lead out: the open fails "not permitted". A path under no root
// is refused the same way. Set once by the worker agent from its assignment (the daemon's roots for
// the job's owner), before the job runs; process-wide, like the umask. Writes go only to writable
// roots. An empty list (the default) confines nothing.
struct OpenRoot {
  std::string path;  // absolute, resolved
  bool writable = false;
};
absl::Status ConfineOpens(const std::vector<OpenRoot>& roots);
// Whether an error may quote what the file at `path` holds (a token id and its position): when
// nothing is confined (the single-user default, where a job reads whatever the worker may), or when
// the deepest root holding `path` is writable (the job owner's own directory, or the job's). Under a
// read-only root the file may be another user's, and its bytes stay out of messages.
bool MayQuoteContents(const std::string& path);
// For tests: use the O_NOFOLLOW walk even where openat2 exists.
void ForceOpenWalkForTesting(bool force);

// Makes the directory `dir` and its missing parents (0700 under the worker's umask); confined to a
// writable root when ConfineOpens is set. `what` names it in errors.
absl::Status EnsureDirectory(const std::string& dir, std::string_view what);

// Opens `path` read-only, only if it is a regular file. The open itself cannot block: it uses
// O_NONBLOCK (a FIFO with no writer, or a device, would otherwise hang the open or the first
// read), the type is checked with fstat on the opened descriptor (no window between a check and
// the open), and O_NONBLOCK is cleared before the descriptor is returned. A FIFO, socket, device
// or directory is refused: "<what>: <path> is a FIFO, not a regular file (give a regular file)".
// `what` names the input (a spec field such as "spec.data.path"); empty leaves the prefix out.
absl::StatusOr<Fd> OpenRegularFile(const std::string& path, std::string_view what);
// Reads a whole regular file (OpenRegularFile's rule).
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, std::string_view what);

// Creates (or truncates) `path` for writing (mode 0644 before the umask); confined to a writable
// root when ConfineOpens is set.
absl::StatusOr<Fd> CreateFile(const std::string& path);
// Writes `contents` to `path` (truncating) and fsyncs the file.
absl::Status WriteFileSynced(const std::string& path, const std::string& contents);
// Writes all of `n` bytes to `fd` (retrying short writes and EINTR); `path` names it in errors.
absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path);
// fsyncs a directory, so that renames and creations inside it are durable.
absl::Status FsyncDir(const std::string& dir);

// An exclusive flock(2) on a directory, held until destruction. The kernel drops it when the
// process dies, however it dies, so what a holder finds half-written under the directory was left
// by a writer that is gone.
class DirLock {
 public:
  // Blocks until the lock is free. Fails where the filesystem has no flock on directories.
  static absl::StatusOr<DirLock> Acquire(const std::string& dir);

 private:
  explicit DirLock(Fd fd) : fd_(std::move(fd)) {}
  Fd fd_;
};

}  // namespace ftd::engine

#include "worker/engine/core/fs_util.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "spec/input_files.h"
#include "worker/data/confined_open.h"

namespace ftd::engine {
namespace {

using data::OpenConfined;
using data::OpenError;

std::string Prefix(std::string_view what) { return what.empty() ? std::string() : std::string(what) + ": "; }

}  // namespace

// The confinement itself lives below the tokenizer and the dataset cache (worker/data/confined_open.h),
// so that their opens go through the same roots.
absl::Status ConfineOpens(const std::vector<OpenRoot>& roots) {
  std::vector<data::OpenRoot> all;
  for (const OpenRoot& r : roots) all.push_back({r.path, r.writable, /*optional=*/false});
  return data::ConfineOpens(all);
}

bool MayQuoteContents(const std::string& path) { return data::MayQuoteContents(path); }

void ForceOpenWalkForTesting(bool force) { data::ForceOpenWalkForTesting(force); }

absl::Status EnsureDirectory(const std::string& dir, std::string_view what) { return data::EnsureDirectory(dir, what); }

absl::StatusOr<Fd> OpenRegularFile(const std::string& path, std::string_view what) {
  Fd fd(OpenConfined(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0, /*write=*/false));
  if (fd.get() < 0) {
    const int e = errno;
    const std::string msg = OpenError(what, "cannot open", path, e, false);
    return e == ENOENT ? absl::NotFoundError(msg) : absl::FailedPreconditionError(msg);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return absl::InternalError(absl::StrCat(Prefix(what), "stat ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Prefix(what), path, " is ", spec::FileTypeName(st.st_mode),
                     ", not a regular file (give a regular file)"));
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat(Prefix(what), "fcntl ", path, ": ", std::strerror(errno)));
  }
  return fd;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, std::string_view what) {
  auto fd = OpenRegularFile(path, what);
  if (!fd.ok()) return fd.status();
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd->get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(absl::StrCat(Prefix(what), "read ", path, ": ", std::strerror(errno)));
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return absl::InternalError(absl::StrCat("write ", path, ": ", std::strerror(errno)));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::StatusOr<Fd> CreateFile(const std::string& path) {
  Fd fd(OpenConfined(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644, /*write=*/true));
  if (fd.get() < 0) {
    const int e = errno;
    return absl::InternalError(OpenError("", "create", path, e, true));
  }
  return fd;
}

absl::Status WriteFileSynced(const std::string& path, const std::string& contents) {
  auto created = CreateFile(path);
  if (!created.ok()) return created.status();
  Fd fd = std::move(*created);
  if (auto s = WriteAll(fd.get(), contents.data(), contents.size(), path); !s.ok()) return s;
  if (::fsync(fd.get()) != 0) return absl::InternalError(absl::StrCat("fsync ", path, ": ", std::strerror(errno)));
  if (::close(fd.release()) != 0) return absl::InternalError(absl::StrCat("close ", path, ": ", std::strerror(errno)));
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return absl::InternalError(absl::StrCat("open ", dir, ": ", std::strerror(errno)));
  if (::fsync(fd.get()) != 0) return absl::InternalError(absl::StrCat("fsync ", dir, ": ", std::strerror(errno)));
  return absl::OkStatus();
}

absl::StatusOr<DirLock> DirLock::Acquire(const std::string& dir) {
  Fd fd(OpenConfined(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0, /*write=*/true));
  if (fd.get() < 0) {
    const int e = errno;
    return absl::InternalError(OpenError("", "open", dir, e, true));
  }
  while (::flock(fd.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return absl::UnavailableError(absl::StrCat("lock ", dir, ": ", std::strerror(errno)));
  }
  return DirLock(std::move(fd));
}

}  // namespace ftd::engine

#include "worker/engine/fs_util.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "spec/input_files.h"

namespace ftd::engine {
namespace {

std::string Prefix(std::string_view what) { return what.empty() ? std::string() : std::string(what) + ": "; }

struct Root {
  std::string path;
  bool writable = false;
  Fd fd;  // O_PATH descriptor of the directory
};
// Set once by ConfineOpens before the job runs, read by every open after (never freed).
std::vector<Root>* g_roots = nullptr;
std::atomic<bool> g_force_walk{false};

bool Beneath(const std::string& path, const std::string& root) {
  return path == root || root == "/" ||
         (path.size() > root.size() && path.compare(0, root.size(), root) == 0 && path[root.size()] == '/');
}

// Each component with O_NOFOLLOW, directories as O_PATH: any symbolic link is refused.
int OpenWalk(int dirfd, const std::string& rel, int flags, mode_t mode) {
  const std::vector<std::string> parts = absl::StrSplit(rel, '/', absl::SkipEmpty());
  if (parts.empty()) return ::openat(dirfd, ".", flags | O_NOFOLLOW, mode);
  int cur = dirfd;
  Fd hold;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i] == "..") {
      errno = EXDEV;
      return -1;
    }
    if (i + 1 == parts.size()) return ::openat(cur, parts[i].c_str(), flags | O_NOFOLLOW, mode);
    const int next = ::openat(cur, parts[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) {
      struct stat st {};
      // O_DIRECTORY | O_NOFOLLOW says ENOTDIR for a symbolic link: say ELOOP, as openat2 would.
      if (errno == ENOTDIR && ::fstatat(cur, parts[i].c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
        errno = ELOOP;
      }
      return -1;
    }
    hold = Fd(next);
    cur = next;
  }
  return -1;
}

// Opens `rel` beneath `dirfd`: nothing on its way (`..`, an absolute or relative symbolic link, a
// /proc magic link) may lead out of it.
int OpenBeneath(int dirfd, const std::string& rel, int flags, mode_t mode) {
  if (!g_force_walk.load()) {
    struct open_how how {};
    how.flags = static_cast<uint64_t>(flags);
    how.mode = (flags & O_CREAT) != 0 ? mode : 0;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    const long fd = ::syscall(SYS_openat2, dirfd, rel.empty() ? "." : rel.c_str(), &how, sizeof how);
    if (fd >= 0 || errno != ENOSYS) return static_cast<int>(fd);
  }
  return OpenWalk(dirfd, rel, flags, mode);
}

// The confining root holding `path` (the deepest), or nullptr.
const Root* RootOf(const std::string& path, bool write) {
  const Root* best = nullptr;
  for (const Root& r : *g_roots) {
    if ((!write || r.writable) && Beneath(path, r.path) && (best == nullptr || r.path.size() > best->path.size())) {
      best = &r;
    }
  }
  return best;
}

std::string RelativeTo(const std::string& path, const std::string& root) {
  if (path.size() <= root.size()) return ".";
  return path.substr(root == "/" ? 1 : root.size() + 1);
}

bool Confined() { return g_roots != nullptr && !g_roots->empty(); }

// ::open, beneath the root that holds `path` when confined. EPERM for a path under no root.
int OpenConfined(const std::string& path, int flags, mode_t mode, bool write) {
  if (!Confined()) return ::open(path.c_str(), flags, mode);
  const Root* r = RootOf(path, write);
  if (r == nullptr) {
    errno = EPERM;
    return -1;
  }
  return OpenBeneath(r->fd.get(), RelativeTo(path, r->path), flags, mode);
}

// The message for a failed confined open: what the kernel refused for leading out, said plainly.
std::string OpenError(std::string_view what, const std::string& verb, const std::string& path, int e, bool write) {
  if (Confined() && (e == EPERM || e == EXDEV || e == ELOOP || e == EACCES)) {
    return absl::StrCat(Prefix(what), "not permitted: ", path, " is outside the directories this job may ",
                        write ? "write" : "read", ", or a symbolic link on its way leads out of them");
  }
  return absl::StrCat(Prefix(what), verb, " ", path, ": ", std::strerror(e));
}

}  // namespace

absl::Status ConfineOpens(const std::vector<OpenRoot>& roots) {
  auto* out = new std::vector<Root>();
  for (const OpenRoot& r : roots) {
    Fd fd(::open(r.path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (fd.get() < 0 && r.writable && errno == ENOENT) {
      std::error_code ec;
      std::filesystem::create_directories(r.path, ec);
      fd = Fd(::open(r.path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    }
    if (fd.get() < 0) {
      const int e = errno;
      delete out;
      return absl::FailedPreconditionError(absl::StrCat("cannot open the job's directory ", r.path, ": ", std::strerror(e)));
    }
    out->push_back(Root{r.path, r.writable, std::move(fd)});
  }
  g_roots = out;
  return absl::OkStatus();
}

void ForceOpenWalkForTesting(bool force) { g_force_walk.store(force); }

bool MayQuoteContents(const std::string& path) {
  if (!Confined()) return true;
  const Root* r = RootOf(path, /*write=*/false);
  return r != nullptr && r->writable;
}

absl::Status EnsureDirectory(const std::string& dir, std::string_view what) {
  if (!Confined()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return absl::InternalError(absl::StrCat(Prefix(what), "create ", dir, ": ", ec.message()));
    return absl::OkStatus();
  }
  const Root* r = RootOf(dir, /*write=*/true);
  if (r == nullptr) return absl::PermissionDeniedError(OpenError(what, "create", dir, EPERM, true));
  // One component at a time beneath the last: each made if missing, none a way out.
  Fd cur(::fcntl(r->fd.get(), F_DUPFD_CLOEXEC, 0));
  const std::vector<std::string> parts = absl::StrSplit(RelativeTo(dir, r->path), '/', absl::SkipEmpty());
  for (const std::string& part : parts) {
    if (part == ".") continue;
    int next = OpenBeneath(cur.get(), part, O_PATH | O_DIRECTORY | O_CLOEXEC, 0);
    if (next < 0 && errno == ENOENT) {
      if (::mkdirat(cur.get(), part.c_str(), 0700) != 0 && errno != EEXIST) {
        return absl::InternalError(absl::StrCat(Prefix(what), "create ", dir, ": ", std::strerror(errno)));
      }
      next = OpenBeneath(cur.get(), part, O_PATH | O_DIRECTORY | O_CLOEXEC, 0);
    }
    if (next < 0) {
      const int e = errno == ENOTDIR ? ELOOP : errno;
      return absl::PermissionDeniedError(OpenError(what, "create", dir, e, true));
    }
    cur = Fd(next);
  }
  return absl::OkStatus();
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

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

#include "worker/data/confined_open.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "util/unique_fd.h"

namespace ftd::data {
namespace {

std::string Prefix(std::string_view what) { return what.empty() ? std::string() : std::string(what) + ": "; }

struct Root {
  std::string path;
  bool writable = false;
  int fd = -1;  // O_PATH descriptor of the directory (never closed: the roots live as long as the process)
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
  util::Fd hold;
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
    hold.reset(next);
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

}  // namespace

int OpenConfined(const std::string& path, int flags, mode_t mode, bool write) {
  if (!Confined()) return ::open(path.c_str(), flags, mode);
  const Root* r = RootOf(path, write);
  if (r == nullptr) {
    errno = EPERM;
    return -1;
  }
  return OpenBeneath(r->fd, RelativeTo(path, r->path), flags, mode);
}

std::string OpenError(std::string_view what, std::string_view verb, const std::string& path, int e, bool write) {
  // EACCES is the file's own mode or ACL refusing the worker's user, inside the roots: said as what it
  // is ("Permission denied"), not as a way out of the roots.
  if (Confined() && (e == EPERM || e == EXDEV || e == ELOOP)) {
    return absl::StrCat(Prefix(what), "not permitted: ", path, " is outside the directories this job may ",
                        write ? "write" : "read", ", or a symbolic link on its way leads out of them");
  }
  return absl::StrCat(Prefix(what), std::string(verb), " ", path, ": ", std::strerror(e));
}


absl::Status ConfineOpens(const std::vector<OpenRoot>& roots) {
  auto* out = new std::vector<Root>();
  for (const OpenRoot& r : roots) {
    int fd = ::open(r.path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 && r.writable && errno == ENOENT) {
      std::error_code ec;
      std::filesystem::create_directories(r.path, ec);
      fd = ::open(r.path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    }
    if (fd < 0 && r.optional) continue;
    if (fd < 0) {
      const int e = errno;
      for (const Root& done : *out) ::close(done.fd);
      delete out;
      return absl::FailedPreconditionError(absl::StrCat("cannot open the job's directory ", r.path, ": ", std::strerror(e)));
    }
    out->push_back(Root{r.path, r.writable, fd});
  }
  g_roots = out;
  return absl::OkStatus();
}

bool Confined() { return g_roots != nullptr && !g_roots->empty(); }

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
  util::Fd cur(::fcntl(r->fd, F_DUPFD_CLOEXEC, 0));
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
    cur.reset(next);
  }
  return absl::OkStatus();
}

}  // namespace ftd::data

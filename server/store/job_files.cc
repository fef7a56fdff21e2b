#include "server/store/job_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spec/bytes.h"
#include "util/dir_tree.h"

namespace ftd::server {
namespace fs = std::filesystem;

namespace {

// N of a "step-N" name (with `suffix` after it), or -1.
int64_t StepOf(const std::string& name, std::string_view suffix) {
  if (!name.starts_with("step-") || !name.ends_with(suffix)) return -1;
  const std::string_view digits = std::string_view(name).substr(5, name.size() - 5 - suffix.size());
  int64_t n = -1;
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (digits.empty() || r.ec != std::errc() || r.ptr != digits.data() + digits.size()) return -1;
  return n;
}

absl::Status FileError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno)));
}

// ChownTree beneath the open directory `fd` (which it closes); `path` names it in errors.
absl::Status ChownBeneath(int fd, const std::string& path, uid_t uid, gid_t gid) {
  auto error = [&](const std::string& what) {
    const int err = errno;
    return absl::InternalError(absl::StrCat("cannot give ", what, " to uid ", uid, ": ", std::strerror(err)));
  };
  if (::fchown(fd, uid, gid) != 0) {
    auto st = error(path);
    ::close(fd);
    return st;
  }
  return util::ForEachEntry(fd, path, [&](int dir, const std::string& name) {
    const std::string sub = path + "/" + name;
    const int child = ::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (child >= 0) return ChownBeneath(child, sub, uid, gid);
    if (errno == ENOTDIR || errno == ELOOP) {  // a file or a link: changed itself, never its target
      if (::fchownat(dir, name.c_str(), uid, gid, AT_SYMLINK_NOFOLLOW) != 0 && errno != ENOENT) return error(sub);
    } else if (errno != ENOENT) {
      return error(sub);
    }
    return absl::OkStatus();
  });
}

// Copies the regular file open as `in` to `name` beneath `to_fd`.
absl::Status CopyFile(int in, const struct stat& s, int to_fd, const std::string& name, const std::string& dst) {
  const int out = ::openat(to_fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, s.st_mode & 0777);
  if (out < 0) return FileError("write", dst);
  absl::Status st;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(in, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      st = FileError("copy to", dst);
      break;
    }
    for (ssize_t done = 0; done < n && st.ok();) {
      const ssize_t w = ::write(out, buf + done, static_cast<size_t>(n - done));
      if (w < 0 && errno != EINTR) st = FileError("write", dst);
      if (w > 0) done += w;
    }
    if (!st.ok()) break;
  }
  if (::close(out) != 0 && st.ok()) st = FileError("write", dst);
  return st;
}

// LinkOrCopyTree from the open directory `from_fd` to the open directory `to_fd` (it closes both).
// Every source is opened with O_NOFOLLOW beneath its parent's descriptor; links (and anything that
// is neither a directory nor a regular file) are skipped, so no byte from outside the tree is copied.
absl::Status LinkOrCopyBeneath(int from_fd, const std::string& from, int to_fd, const std::string& to) {
  auto st = util::ForEachEntry(from_fd, from, [&](int dir, const std::string& name) {
    const std::string src = from + "/" + name, dst = to + "/" + name;
    const int in = ::openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (in < 0) return errno == ELOOP || errno == ENOENT ? absl::OkStatus() : FileError("read", src);  // ELOOP: a link
    absl::Status st;
    struct stat s {};
    if (::fstat(in, &s) != 0) {
      st = FileError("read", src);
    } else if (S_ISDIR(s.st_mode)) {
      if (::mkdirat(to_fd, name.c_str(), s.st_mode & 0777) != 0 && errno != EEXIST) {
        st = FileError("create", dst);
      } else if (const int out = ::openat(to_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                 out < 0) {
        st = FileError("create", dst);
      } else {
        st = LinkOrCopyBeneath(::dup(in), src, out, dst);
      }
    } else if (S_ISREG(s.st_mode)) {
      // A hard link of the entry itself (linkat without AT_SYMLINK_FOLLOW never follows a link
      // swapped in since the open); a byte copy from the opened file where links cannot go.
      if (::linkat(dir, name.c_str(), to_fd, name.c_str(), 0) != 0) st = CopyFile(in, s, to_fd, name, dst);
    }
    ::close(in);
    return st;
  });
  ::close(to_fd);
  return st;
}

}  // namespace

absl::Status ChownTree(const std::string& dir, uid_t uid, gid_t gid) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot give ", dir, " to uid ", uid, ": ", std::strerror(errno)));
  }
  return ChownBeneath(fd, dir, uid, gid);
}

int64_t TreeBytes(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(fs::symlink_status(path, ec))) return static_cast<int64_t>(fs::file_size(path, ec));
  int64_t total = 0;
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code fe;
    if (it->is_regular_file(fe) && !it->is_symlink(fe)) total += static_cast<int64_t>(it->file_size(fe));
  }
  return total;
}

int OpenDirBeneath(const std::string& base, const std::string& rel) {
  int fd = ::open(base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  for (const auto& part : fs::path(rel)) {
    if (fd < 0) break;
    const std::string name = part.string();
    if (name.empty() || name == ".") continue;
    if (name == ".." || name == "/") {
      ::close(fd);
      errno = EPERM;
      return -1;
    }
    const int next = ::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    const int err = errno;
    ::close(fd);
    errno = err;
    fd = next;
  }
  return fd;
}

std::optional<std::string> NewestCheckpoint(const std::string& dir, const std::string& rel) {
  const int fd = OpenDirBeneath(dir, rel);
  if (fd < 0) return std::nullopt;
  int64_t best = -1;
  std::string name;
  (void)util::ForEachEntry(fd, dir, [&](int d, const std::string& entry) {
    const int64_t n = StepOf(entry, "");
    if (n <= best) return absl::OkStatus();
    const int step = ::openat(d, entry.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (step < 0) return absl::OkStatus();
    struct stat s {};
    if (::fstatat(step, "MANIFEST.json", &s, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(s.st_mode)) {
      best = n;
      name = entry;
    }
    ::close(step);
    return absl::OkStatus();
  });
  if (best < 0) return std::nullopt;
  return (fs::path(dir) / rel / name).string();
}

absl::Status LinkOrCopyTree(const std::string& from, const std::string& to) { return LinkOrCopyTree(from, "", to); }

absl::Status LinkOrCopyTree(const std::string& base, const std::string& rel, const std::string& to) {
  const std::string from = rel.empty() ? base : (fs::path(base) / rel).string();
  std::error_code ec;
  fs::create_directories(to, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", to, ": ", ec.message()));
  // The source itself is never a link either (it may belong to a worker's user).
  const int from_fd = rel.empty() ? ::open(from.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                                  : OpenDirBeneath(base, rel);
  if (from_fd < 0) return FileError("read", from);
  const int to_fd = ::open(to.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (to_fd < 0) {
    auto st = FileError("write", to);
    ::close(from_fd);
    return st;
  }
  return LinkOrCopyBeneath(from_fd, from, to_fd, to);
}

int64_t RemovePartialCheckpoints(const std::string& dir, const std::string& rel) {
  const int fd = OpenDirBeneath(dir, rel);
  if (fd < 0) return 0;
  const std::string path = rel.empty() ? dir : (fs::path(dir) / rel).string();
  int64_t freed = 0;
  (void)util::ForEachEntry(fd, path, [&](int d, const std::string& name) {
    if (StepOf(name, ".tmp") < 0) return absl::OkStatus();
    int64_t bytes = 0;
    if (util::RemoveEntryAt(d, name, path + "/" + name, &bytes).ok()) freed += bytes;
    return absl::OkStatus();
  });
  return freed;
}

std::string StepLine(const ftd::v1::StepReport& s) {
  std::string line = absl::StrFormat("[ftd] step %d", s.step());
  if (s.total_steps() > 0) absl::StrAppend(&line, "/", s.total_steps());
  absl::StrAppend(&line, absl::StrFormat(" loss %.4f", s.loss()));
  if (s.has_eval_loss()) absl::StrAppend(&line, absl::StrFormat(" eval_loss %.4f", s.eval_loss()));  // measured here
  absl::StrAppend(&line, absl::StrFormat(" lr %.3g grad_norm %.3g %.0f tok/s %.3fs/step", s.lr(), s.grad_norm(),
                                         s.tokens_per_s(), s.step_time_s()));
  return line;
}

std::string CheckpointWriteNote(const ftd::v1::PhaseProgress& p) {
  return absl::StrFormat("writing the checkpoint after step %d: %s of %s, about %.0fs left", p.step(),
                         spec::FormatBytes(static_cast<double>(p.done_bytes())),
                         spec::FormatBytes(static_cast<double>(p.total_bytes())), std::ceil(p.eta_s()));
}

}  // namespace ftd::server

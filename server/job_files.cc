#include "server/job_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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
  DIR* d = ::fdopendir(fd);  // owns fd from here
  if (d == nullptr) {
    auto st = error(path);
    ::close(fd);
    return st;
  }
  absl::Status st;
  while (st.ok()) {
    errno = 0;
    const dirent* e = ::readdir(d);
    if (e == nullptr) {
      if (errno != 0) st = error(path);
      break;
    }
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string sub = path + "/" + name;
    const int child = ::openat(::dirfd(d), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (child >= 0) {
      st = ChownBeneath(child, sub, uid, gid);
    } else if (errno == ENOTDIR || errno == ELOOP) {  // a file or a link: changed itself, never its target
      if (::fchownat(::dirfd(d), name.c_str(), uid, gid, AT_SYMLINK_NOFOLLOW) != 0 && errno != ENOENT) st = error(sub);
    } else if (errno != ENOENT) {
      st = error(sub);
    }
  }
  ::closedir(d);
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

absl::StatusOr<int64_t> RemoveTree(const std::string& path) {
  const int64_t bytes = TreeBytes(path);
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", ec.message()));
  return bytes;
}

std::optional<std::string> NewestCheckpoint(const std::string& dir) {
  std::error_code ec;
  int64_t best = -1;
  std::string path;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t n = StepOf(it->path().filename().string(), "");
    std::error_code fe;
    if (n > best && fs::is_regular_file(it->path() / "MANIFEST.json", fe)) {
      best = n;
      path = it->path().string();
    }
  }
  if (best < 0) return std::nullopt;
  return path;
}

absl::Status LinkOrCopyTree(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::create_directories(to, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", to, ": ", ec.message()));
  for (fs::recursive_directory_iterator it(from, ec), end; it != end; it.increment(ec)) {
    if (ec) break;
    const fs::path dst = fs::path(to) / fs::relative(it->path(), from);
    if (it->is_directory()) {
      fs::create_directories(dst, ec);
    } else {
      fs::create_hard_link(it->path(), dst, ec);
      if (ec) {
        ec.clear();
        fs::copy_file(it->path(), dst, ec);
      }
    }
    if (ec) return absl::InternalError(absl::StrCat("cannot copy ", it->path().string(), " to ", dst.string(), ": ",
                                                    ec.message()));
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot read ", from, ": ", ec.message()));
  return absl::OkStatus();
}

int64_t RemovePartialCheckpoints(const std::string& dir) {
  std::error_code ec;
  int64_t freed = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (StepOf(it->path().filename().string(), ".tmp") < 0) continue;
    auto r = RemoveTree(it->path().string());
    if (r.ok()) freed += *r;
  }
  return freed;
}

std::string StepLine(const ftd::v1::StepReport& s) {
  std::string line = absl::StrFormat("[ftd] step %d", s.step());
  if (s.total_steps() > 0) absl::StrAppend(&line, "/", s.total_steps());
  absl::StrAppend(&line, absl::StrFormat(" loss %.4f lr %.3g grad_norm %.3g %.0f tok/s %.3fs/step", s.loss(), s.lr(),
                                         s.grad_norm(), s.tokens_per_s(), s.step_time_s()));
  return line;
}

std::string CheckpointWriteNote(const ftd::v1::PhaseProgress& p) {
  constexpr double kGiB = 1 << 30;
  return absl::StrFormat("writing the checkpoint after step %d: %.1f of %.1f GiB, about %.0fs left", p.step(),
                         static_cast<double>(p.done_bytes()) / kGiB, static_cast<double>(p.total_bytes()) / kGiB,
                         std::ceil(p.eta_s()));
}

}  // namespace ftd::server

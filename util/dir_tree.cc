#include "util/dir_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ftd::util {
namespace {

absl::Status FileError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno)));
}

// Removes everything beneath the open directory `fd` (which it closes).
absl::Status RemoveBeneath(int fd, const std::string& path, int64_t* bytes) {
  return ForEachEntry(fd, path, [&](int dir, const std::string& name) {
    return RemoveEntryAt(dir, name, path + "/" + name, bytes);
  });
}

}  // namespace

absl::Status ForEachEntry(int fd, const std::string& path,
                          const std::function<absl::Status(int, const std::string&)>& each) {
  DIR* d = ::fdopendir(fd);  // owns fd from here
  if (d == nullptr) {
    auto st = FileError("read", path);
    ::close(fd);
    return st;
  }
  absl::Status st;
  while (st.ok()) {
    errno = 0;
    const dirent* e = ::readdir(d);
    if (e == nullptr) {
      if (errno != 0) st = FileError("read", path);
      break;
    }
    const std::string name = e->d_name;
    if (name != "." && name != "..") st = each(::dirfd(d), name);
  }
  ::closedir(d);
  return st;
}

absl::Status RemoveEntryAt(int dir, const std::string& name, const std::string& path, int64_t* bytes) {
  const int child = ::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (child >= 0) {
    if (auto st = RemoveBeneath(child, path, bytes); !st.ok()) return st;
    if (::unlinkat(dir, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) return FileError("remove", path);
  } else if (errno == ENOTDIR || errno == ELOOP) {  // a file or a link: removed itself
    struct stat s {};
    if (::fstatat(dir, name.c_str(), &s, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(s.st_mode)) *bytes += s.st_size;
    if (::unlinkat(dir, name.c_str(), 0) != 0 && errno != ENOENT) return FileError("remove", path);
  } else if (errno != ENOENT) {
    return FileError("remove", path);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RemoveTree(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return 0;
    if (errno != ENOTDIR && errno != ELOOP) return FileError("remove", path);
    struct stat st {};  // a file, or a link: removed itself
    const int64_t bytes = ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) ? st.st_size : 0;
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return FileError("remove", path);
    return bytes;
  }
  int64_t bytes = 0;
  if (auto st = RemoveBeneath(fd, path, &bytes); !st.ok()) return st;
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) return FileError("remove", path);
  return bytes;
}

}  // namespace ftd::util

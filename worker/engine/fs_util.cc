#include "worker/engine/fs_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ftd::engine {

absl::Status WriteFileSynced(const std::string& path, const std::string& contents) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("create ", path, ": ", std::strerror(errno)));
  const char* p = contents.data();
  size_t n = contents.size();
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int e = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("write ", path, ": ", std::strerror(e)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("fsync ", path, ": ", std::strerror(e)));
  }
  if (::close(fd) != 0) return absl::InternalError(absl::StrCat("close ", path, ": ", std::strerror(errno)));
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", dir, ": ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0) return absl::InternalError(absl::StrCat("fsync ", dir, ": ", std::strerror(e)));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace ftd::engine

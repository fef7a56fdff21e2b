// The filesystem a directory lies on, for messages (filesystem_info.h).
#include "server/common/filesystem_info.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "spec/bytes.h"

namespace ftd::server {

namespace {

std::string Bytes(double b) { return spec::FormatBytes(b); }

// mountinfo escapes blanks, tabs, newlines and backslashes in paths as octal (\040).
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1])) != 0) {
      out += static_cast<char>(std::strtol(s.substr(i + 1, 3).c_str(), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

std::string DescribeFilesystem(const std::string& dir) {
  std::string where;
  struct stat st {};
  char* real = ::realpath(dir.c_str(), nullptr);
  const std::string path = real != nullptr ? real : dir;
  std::free(real);
  if (::stat(path.c_str(), &st) == 0) {
    std::ifstream in("/proc/self/mountinfo");
    std::string line, best_point, best_source, best_type;
    const std::string dev = absl::StrCat(major(st.st_dev), ":", minor(st.st_dev));
    while (std::getline(in, line)) {
      // id parent major:minor root mount-point options [optional...] - fstype source super-options
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      auto dash = std::find(f.begin(), f.end(), "-");
      if (f.size() < 5 || dash == f.end() || dash + 2 >= f.end() || f[2] != dev) continue;
      const std::string point = Unescape(f[4]);
      const bool under = point == "/" || path == point || path.rfind(point + "/", 0) == 0;
      if (under && point.size() >= best_point.size()) {
        best_point = point;
        best_type = *(dash + 1);
        best_source = Unescape(*(dash + 2));
      }
    }
    if (!best_point.empty()) where = absl::StrCat("filesystem ", best_source, " (", best_type, ") mounted on ", best_point);
  }
  struct statvfs vfs {};
  if (::statvfs(path.c_str(), &vfs) == 0) {
    absl::StrAppend(&where, where.empty() ? "" : ", ",
                    Bytes(static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize)), " of ",
                    Bytes(static_cast<double>(vfs.f_blocks) * static_cast<double>(vfs.f_frsize)), " free");
  }
  return where;
}

std::optional<std::string> FullDisk(const std::string& dir) {
  // The nearest directory that exists: the data directory may not be made yet.
  std::string path = dir;
  struct statvfs vfs {};
  while (::statvfs(path.c_str(), &vfs) != 0) {
    const auto slash = path.find_last_of('/');
    if (slash == std::string::npos || path == "/") return std::nullopt;
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
  // Root may use the blocks reserved for it; others only the available ones.
  const double free_bytes = static_cast<double>(::geteuid() == 0 ? vfs.f_bfree : vfs.f_bavail) * vfs.f_frsize;
  const bool no_inode = vfs.f_files > 0 && (::geteuid() == 0 ? vfs.f_ffree : vfs.f_favail) == 0;
  if (free_bytes >= kRoomToStart && !no_inode) return std::nullopt;
  std::string what = DescribeFilesystem(path);
  if (no_inode) absl::StrAppend(&what, what.empty() ? "" : ", ", "no inode free (no file can be made)");
  return what;
}

}  // namespace ftd::server

// The data directory's modes (data_dir.h).
#include "server/data_dir.h"

#include <filesystem>

namespace ftd::server {
namespace fs = std::filesystem;

void TightenDataDirModes(const std::string& data_dir, bool traversable) {
  std::error_code ec;
  const fs::perms dir_mode = traversable ? fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec
                                         : fs::perms::owner_all;
  fs::permissions(data_dir, dir_mode, fs::perm_options::replace, ec);
  fs::permissions(fs::path(data_dir) / "jobs", dir_mode, fs::perm_options::replace, ec);
  for (const char* name : {"ftd.db", "ftd.db-wal", "ftd.db-shm", "auth.db", "auth.db-wal", "auth.db-shm"}) {
    const fs::path p = fs::path(data_dir) / name;
    if (fs::exists(p, ec)) fs::permissions(p, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace, ec);
  }
}

}  // namespace ftd::server

// The modes of ftd's data directory (docs/security.md): the directory and its databases are their
// owner's only, tightened at every start, so that a directory or database an older ftd left more
// open does not stay so.
#pragma once

#include <string>

namespace ftd::server {

// `data_dir` 0700 and the databases in it (ftd.db, auth.db and their -wal/-shm) 0600. Workers of
// another user (`traversable`) may pass through the data directory and jobs/ (0711) to their job's
// directory and the worker socket, but list neither.
void TightenDataDirModes(const std::string& data_dir, bool traversable);

}  // namespace ftd::server

// How a full disk is named to the one who must free it: the filesystem that holds a directory, its
// mount point and type, and the space free on it, read from /proc/self/mountinfo and statvfs.
#pragma once

#include <string>

namespace ftd::server {

// "filesystem tmpfs (tmpfs) mounted on /srv/ftd, 0 B of 2.0 MiB free": the filesystem that holds
// `dir`, from /proc/self/mountinfo (the mount with dir's device and the longest matching mount point)
// and statvfs. Empty where neither can be read.
std::string DescribeFilesystem(const std::string& dir);

}  // namespace ftd::server

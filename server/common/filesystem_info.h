// How a full disk is named to the one who must free it: the filesystem that holds a directory, its
// mount point and type, and the space free on it, read from /proc/self/mountinfo and statvfs.
#pragma once

#include <optional>
#include <string>

namespace ftd::server {

// "filesystem tmpfs (tmpfs) mounted on /srv/ftd, 0 B of 2.0 MiB free": the filesystem that holds
// `dir`, from /proc/self/mountinfo (the mount with dir's device and the longest matching mount point)
// and statvfs. Empty where neither can be read.
std::string DescribeFilesystem(const std::string& dir);

// Below this much room, a disk is what stopped ftd from starting (its databases' write-ahead logs
// alone need more): ftd then says so rather than which write failed.
inline constexpr double kRoomToStart = 256 * 1024;

// The filesystem of `dir` (or of its nearest existing parent) described as DescribeFilesystem does,
// when it has less than kRoomToStart bytes or no inode left; nullopt while it has room.
std::optional<std::string> FullDisk(const std::string& dir);

}  // namespace ftd::server

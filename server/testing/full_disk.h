// A small filesystem to fill, for tests of a full disk: a tmpfs mounted in a mount namespace of the
// test process's own (nothing outside sees it), and a file that takes every byte left on it.
// Needs root or CAP_SYS_ADMIN; Mount() says why not otherwise, for GTEST_SKIP.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace ftd::server::testing {

// Mounts a tmpfs of `size` ("4m") on `dir`; "" on success, else why not.
inline std::string MountSmallTmpfs(const std::filesystem::path& dir, const char* size) {
  if (::unshare(CLONE_NEWNS) != 0) {
    return std::string("cannot make a mount namespace to mount a small tmpfs (unshare: ") + std::strerror(errno) +
           "); run as root, or with CAP_SYS_ADMIN, to test a full disk";
  }
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return std::strerror(errno);
  const std::string opts = std::string("size=") + size;
  if (::mount("ftd-test-tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
    return "cannot mount a " + std::string(size) + " tmpfs on " + dir.string() + " (" + std::strerror(errno) +
           "); run as root, or with CAP_SYS_ADMIN, to test a full disk";
  }
  return "";
}

// Unmounts on destruction.
struct Unmount {
  std::filesystem::path dir;
  ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
};

// Fills `dir` with one file until the filesystem refuses more; returns its path.
inline std::filesystem::path FillDisk(const std::filesystem::path& dir) {
  const std::filesystem::path filler = dir / "filler";
  const int fd = ::open(filler.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  EXPECT_GE(fd, 0) << std::strerror(errno);
  const std::string block(64 * 1024, 'f');
  for (;;) {
    const ssize_t n = ::write(fd, block.data(), block.size());
    if (n < static_cast<ssize_t>(block.size())) {
      EXPECT_TRUE(n >= 0 || errno == ENOSPC) << std::strerror(errno);
      // Use up the last partial block too.
      while (::write(fd, block.data(), 1) == 1) {
      }
      break;
    }
  }
  ::close(fd);
  return filler;
}

}  // namespace ftd::server::testing

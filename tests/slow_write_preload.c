// An LD_PRELOAD library for tests: a slow disk. With FTD_SLOW_WRITE_MS=<ms>, every write() or
// pwrite() of at least 1024 bytes to a regular file sleeps that long first, so a test can signal a
// process in the middle of a long file write (test_checkpoints.py: a cancel during a checkpoint).
// With FTD_SLOW_READ_MS=<ms>, every read() or pread() asking for at least 1024 bytes of a regular
// file, and every mmap() of one, sleeps that long first (a stop while a checkpoint loads).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static void maybe_sleep_for(const char* var, int fd, size_t n) {
  const char* ms = getenv(var);
  struct stat st;
  if (ms == NULL || n < 1024 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
  const long v = atol(ms);
  struct timespec ts = {v / 1000, (v % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void maybe_sleep(int fd, size_t n) { maybe_sleep_for("FTD_SLOW_WRITE_MS", fd, n); }

ssize_t write(int fd, const void* buf, size_t n) {
  maybe_sleep(fd, n);
  ssize_t (*real)(int, const void*, size_t) = (ssize_t(*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
  return real(fd, buf, n);
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  maybe_sleep(fd, n);
  ssize_t (*real)(int, const void*, size_t, off_t) =
      (ssize_t(*)(int, const void*, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
  return real(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) {
  maybe_sleep(fd, n);
  ssize_t (*real)(int, const void*, size_t, off_t) =
      (ssize_t(*)(int, const void*, size_t, off_t))dlsym(RTLD_NEXT, "pwrite64");
  return real(fd, buf, n, off);
}

ssize_t read(int fd, void* buf, size_t n) {
  maybe_sleep_for("FTD_SLOW_READ_MS", fd, n);
  ssize_t (*real)(int, void*, size_t) = (ssize_t(*)(int, void*, size_t))dlsym(RTLD_NEXT, "read");
  return real(fd, buf, n);
}

ssize_t pread(int fd, void* buf, size_t n, off_t off) {
  maybe_sleep_for("FTD_SLOW_READ_MS", fd, n);
  ssize_t (*real)(int, void*, size_t, off_t) = (ssize_t(*)(int, void*, size_t, off_t))dlsym(RTLD_NEXT, "pread");
  return real(fd, buf, n, off);
}

ssize_t pread64(int fd, void* buf, size_t n, off_t off) {
  maybe_sleep_for("FTD_SLOW_READ_MS", fd, n);
  ssize_t (*real)(int, void*, size_t, off_t) = (ssize_t(*)(int, void*, size_t, off_t))dlsym(RTLD_NEXT, "pread64");
  return real(fd, buf, n, off);
}

void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  if (fd >= 0) maybe_sleep_for("FTD_SLOW_READ_MS", fd, len);
  void* (*real)(void*, size_t, int, int, int, off_t) =
      (void* (*)(void*, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap");
  return real(addr, len, prot, flags, fd, off);
}

void* mmap64(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  if (fd >= 0) maybe_sleep_for("FTD_SLOW_READ_MS", fd, len);
  void* (*real)(void*, size_t, int, int, int, off_t) =
      (void* (*)(void*, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap64");
  return real(addr, len, prot, flags, fd, off);
}

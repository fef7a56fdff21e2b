// An LD_PRELOAD library for tests: a slow disk. With FTD_SLOW_WRITE_MS=<ms>, every write() or
// pwrite() of at least 1024 bytes to a regular file sleeps that long first, so a test can signal a
// process in the middle of a long file write (test_checkpoints.py: a cancel during a checkpoint).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static void maybe_sleep(int fd, size_t n) {
  const char* ms = getenv("FTD_SLOW_WRITE_MS");
  struct stat st;
  if (ms == NULL || n < 1024 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
  const long v = atol(ms);
  struct timespec ts = {v / 1000, (v % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

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

// An LD_PRELOAD library for tests: logs a process's file-system calls, in order, with the paths
// they act on, so a test can check a durability protocol (what is fsynced before what is renamed)
// that a SIGKILL cannot reveal (the page cache survives a killed process).
//
// FTD_FSLOG=<file> names the log; each call appends one line, tab-separated:
//   <CLOCK_MONOTONIC ns> <pid> <tid> <call> <fd or -> <path> [<second path>] [<bytes or flags>]
// for open/openat/creat (the fd returned, "flags=<hex>"), write/pwrite/writev (bytes), fsync,
// fdatasync, close, rename/renameat/renameat2 (old and new path, "flags=<hex>"), mkdir, rmdir,
// unlink/unlinkat/remove, and fflush of a stream ("flush" of its descriptor). Paths are made absolute from the working directory or the directory fd;
// descriptors not opened by path (sockets, pipes) show "?". Only calls that succeed are logged.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_FDS 65536

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -1;
static char* fd_path[MAX_FDS];

// The fortified entry points glibc's headers route some open calls to.
int __open_2(const char* path, int flags);
int __open64_2(const char* path, int flags);
int __openat_2(int dirfd, const char* path, int flags);
int __openat64_2(int dirfd, const char* path, int flags);

// The next definition of `name` (libc's), looked up once per call site.
#define REAL(name)                                                        \
  ({                                                                      \
    static __typeof__(&name) real_;                                       \
    if (real_ == NULL) real_ = (__typeof__(&name))dlsym(RTLD_NEXT, #name); \
    real_;                                                                \
  })

__attribute__((constructor)) static void fslog_init(void) {
  const char* path = getenv("FTD_FSLOG");
  if (path == NULL || *path == '\0') return;
  // A raw syscall: the log's own open is not logged.
  log_fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

static void emit(const char* line, size_t n) {
  while (n > 0) {
    ssize_t w = syscall(SYS_write, log_fd, line, n);
    if (w <= 0) return;
    line += w;
    n -= (size_t)w;
  }
}

// Absolute form of `path` as seen from `dirfd` (AT_FDCWD: the working directory). Caller frees.
static char* absolute(int dirfd, const char* path) {
  if (path == NULL) return strdup("?");
  if (path[0] == '/') return strdup(path);
  char base[4096];
  if (dirfd == AT_FDCWD) {
    if (syscall(SYS_getcwd, base, sizeof base) < 0) return strdup(path);
  } else if (dirfd >= 0 && dirfd < MAX_FDS && fd_path[dirfd] != NULL) {
    snprintf(base, sizeof base, "%s", fd_path[dirfd]);
  } else {
    return strdup(path);
  }
  char* out = malloc(strlen(base) + strlen(path) + 2);
  sprintf(out, "%s/%s", base, path);
  return out;
}

static void log_call(const char* call, int fd, const char* p1, const char* p2, const char* extra) {
  if (log_fd < 0 || fd == log_fd) return;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  char line[9000];
  char fds[16] = "-";
  if (fd >= 0) snprintf(fds, sizeof fds, "%d", fd);
  int n = snprintf(line, sizeof line, "%lld\t%d\t%ld\t%s\t%s\t%s", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec,
                   (int)getpid(), (long)syscall(SYS_gettid), call, fds, p1 ? p1 : "?");
  if (p2 != NULL && n < (int)sizeof line) n += snprintf(line + n, sizeof line - (size_t)n, "\t%s", p2);
  if (extra != NULL && n < (int)sizeof line) n += snprintf(line + n, sizeof line - (size_t)n, "\t%s", extra);
  if (n >= (int)sizeof line - 1) n = (int)sizeof line - 2;
  line[n++] = '\n';
  emit(line, (size_t)n);
}

static const char* path_of(int fd) { return fd >= 0 && fd < MAX_FDS && fd_path[fd] != NULL ? fd_path[fd] : "?"; }

static int opened(const char* call, int fd, int dirfd, const char* path, int flags) {
  if (fd < 0 || log_fd < 0) return fd;
  int saved = errno;
  pthread_mutex_lock(&mu);
  char* abs = absolute(dirfd, path);
  if (fd < MAX_FDS) {
    free(fd_path[fd]);
    fd_path[fd] = abs;
  }
  char extra[32];
  snprintf(extra, sizeof extra, "flags=%x", (unsigned)flags);
  log_call(call, fd, abs, NULL, extra);
  if (fd >= MAX_FDS) free(abs);
  pthread_mutex_unlock(&mu);
  errno = saved;
  return fd;
}

static void on_fd(const char* call, int fd, long long bytes) {
  if (log_fd < 0) return;
  int saved = errno;
  pthread_mutex_lock(&mu);
  char extra[32];
  snprintf(extra, sizeof extra, "%lld", bytes);
  log_call(call, fd, path_of(fd), NULL, bytes >= 0 ? extra : NULL);
  pthread_mutex_unlock(&mu);
  errno = saved;
}

static void on_paths(const char* call, int dirfd1, const char* a, int dirfd2, const char* b, unsigned flags) {
  if (log_fd < 0) return;
  int saved = errno;
  pthread_mutex_lock(&mu);
  char* pa = absolute(dirfd1, a);
  char* pb = b != NULL ? absolute(dirfd2, b) : NULL;
  char extra[32];
  snprintf(extra, sizeof extra, "flags=%x", flags);
  log_call(call, -1, pa, pb, extra);
  free(pa);
  free(pb);
  pthread_mutex_unlock(&mu);
  errno = saved;
}

static mode_t mode_arg(int flags, va_list ap) {
  return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return opened("open", REAL(open)(path, flags, mode), AT_FDCWD, path, flags);
}
int open64(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return opened("open", REAL(open64)(path, flags, mode), AT_FDCWD, path, flags);
}
int __open_2(const char* path, int flags) { return opened("open", REAL(__open_2)(path, flags), AT_FDCWD, path, flags); }
int __open64_2(const char* path, int flags) {
  return opened("open", REAL(__open64_2)(path, flags), AT_FDCWD, path, flags);
}
int openat(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return opened("open", REAL(openat)(dirfd, path, flags, mode), dirfd, path, flags);
}
int openat64(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return opened("open", REAL(openat64)(dirfd, path, flags, mode), dirfd, path, flags);
}
int __openat_2(int dirfd, const char* path, int flags) {
  return opened("open", REAL(__openat_2)(dirfd, path, flags), dirfd, path, flags);
}
int __openat64_2(int dirfd, const char* path, int flags) {
  return opened("open", REAL(__openat64_2)(dirfd, path, flags), dirfd, path, flags);
}
int creat(const char* path, mode_t mode) {
  return opened("open", REAL(creat)(path, mode), AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC);
}
int creat64(const char* path, mode_t mode) {
  return opened("open", REAL(creat64)(path, mode), AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC);
}

ssize_t write(int fd, const void* buf, size_t n) {
  ssize_t r = REAL(write)(fd, buf, n);
  if (r >= 0) on_fd("write", fd, r);
  return r;
}
ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  ssize_t r = REAL(pwrite)(fd, buf, n, off);
  if (r >= 0) on_fd("pwrite", fd, r);
  return r;
}
ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) {
  ssize_t r = REAL(pwrite64)(fd, buf, n, off);
  if (r >= 0) on_fd("pwrite", fd, r);
  return r;
}
ssize_t writev(int fd, const struct iovec* iov, int cnt) {
  ssize_t r = REAL(writev)(fd, iov, cnt);
  if (r >= 0) on_fd("write", fd, r);
  return r;
}
int fsync(int fd) {
  int r = REAL(fsync)(fd);
  if (r == 0) on_fd("fsync", fd, -1);
  return r;
}
int fdatasync(int fd) {
  int r = REAL(fdatasync)(fd);
  if (r == 0) on_fd("fdatasync", fd, -1);
  return r;
}
int close(int fd) {
  if (log_fd >= 0 && fd == log_fd) {  // keep the log open whatever the process closes
    errno = EBADF;
    return -1;
  }
  int r = REAL(close)(fd);
  if (r == 0 && log_fd >= 0) {
    on_fd("close", fd, -1);
    pthread_mutex_lock(&mu);
    if (fd >= 0 && fd < MAX_FDS) {
      free(fd_path[fd]);
      fd_path[fd] = NULL;
    }
    pthread_mutex_unlock(&mu);
  }
  return r;
}

// Streams (stdio, and C++ iostreams over it) reach write() inside libc, out of the shim's sight;
// their flushes are logged instead, as "flush" of the stream's descriptor.
int fflush(FILE* f) {
  int r = REAL(fflush)(f);
  if (r == 0 && f != NULL) on_fd("flush", fileno(f), -1);
  return r;
}

int rename(const char* a, const char* b) {
  int r = REAL(rename)(a, b);
  if (r == 0) on_paths("rename", AT_FDCWD, a, AT_FDCWD, b, 0);
  return r;
}
int renameat(int da, const char* a, int db, const char* b) {
  int r = REAL(renameat)(da, a, db, b);
  if (r == 0) on_paths("rename", da, a, db, b, 0);
  return r;
}
int renameat2(int da, const char* a, int db, const char* b, unsigned flags) {
  int r = REAL(renameat2)(da, a, db, b, flags);
  if (r == 0) on_paths("rename", da, a, db, b, flags);
  return r;
}
int mkdir(const char* p, mode_t m) {
  int r = REAL(mkdir)(p, m);
  if (r == 0) on_paths("mkdir", AT_FDCWD, p, 0, NULL, 0);
  return r;
}
int rmdir(const char* p) {
  int r = REAL(rmdir)(p);
  if (r == 0) on_paths("rmdir", AT_FDCWD, p, 0, NULL, 0);
  return r;
}
int unlink(const char* p) {
  int r = REAL(unlink)(p);
  if (r == 0) on_paths("unlink", AT_FDCWD, p, 0, NULL, 0);
  return r;
}
int unlinkat(int d, const char* p, int flags) {
  int r = REAL(unlinkat)(d, p, flags);
  if (r == 0) on_paths("unlink", d, p, 0, NULL, (unsigned)flags);
  return r;
}
int remove(const char* p) {
  int r = REAL(remove)(p);
  if (r == 0) on_paths("unlink", AT_FDCWD, p, 0, NULL, 0);
  return r;
}

// An LD_PRELOAD library for tests: a library that calls exit() from inside the worker. With
// FTD_EXIT_IN_FSYNC=<code>, the process's first fsync() calls exit(<code>) instead, as a library
// that gives up on its own would (test_checkpoints.py: the worker's exit hook must name it).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

int fsync(int fd) {
  const char* code = getenv("FTD_EXIT_IN_FSYNC");
  if (code != NULL) exit(atoi(code));
  int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  return real(fd);
}

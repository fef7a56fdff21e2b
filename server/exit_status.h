// How a worker process ended, as the kernel reported it when it was reaped.
#pragma once

#include <string>

namespace ftd::server {

struct ExitStatus {
  bool signaled = false;
  int code = 0;    // exit code when !signaled
  int signal = 0;  // terminating signal when signaled
};

// "exit code 3", "killed by signal 9 (SIGKILL)".
std::string Describe(const ExitStatus& st);

}  // namespace ftd::server

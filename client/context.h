// What every ftctl command shares: the global flags (--addr, --timeout), their resolution against
// $FTD_ADDR and the config file, the connection to ftd, how errors are printed, and the exit codes.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "client/job_client.h"

namespace ftd::client {

// Exit codes (docs/ftctl.md): a job's outcome for wait/watch/submit --wait, else whether the call worked.
inline constexpr int kExitOk = 0;
inline constexpr int kExitJobFailed = 1;
inline constexpr int kExitJobCancelled = 2;
inline constexpr int kExitCallFailed = 3;
inline constexpr int kExitUsage = 64;
inline constexpr int kExitInterrupted = 130;

// Prints "ftctl: CODE: message" on stderr; returns kExitCallFailed.
int Fail(const absl::Status& st);
// Prints "ftctl: message" on stderr; returns kExitUsage.
int Usage(const std::string& msg);

// The flags every command takes (before or after the command's name).
struct GlobalFlags {
  std::string addr;      // empty: $FTD_ADDR, the config file, 127.0.0.1:7070
  double timeout_s = 0;  // 0: the config file's, else 30
};

// The config file's path: $FTCTL_CONFIG, else $XDG_CONFIG_HOME/ftd/ftctl.json, else
// ~/.config/ftd/ftctl.json ("" when none can be named).
std::string ConfigPath();

// The connection settings from the flags, the environment and the config file, in that order of
// precedence. A config file that exists but does not parse is INVALID_ARGUMENT naming it.
absl::StatusOr<ClientOptions> ResolveOptions(const GlobalFlags& flags);

// What a command runs with: the resolved options and the client, made on first use (commands that
// fail on their arguments never connect).
class Context {
 public:
  explicit Context(ClientOptions opts) : opts_(std::move(opts)) {}
  const ClientOptions& options() const { return opts_; }
  JobClient& client();

 private:
  ClientOptions opts_;
  std::unique_ptr<JobClient> client_;
};

// A command: its subcommand (with its flags bound to state the runner captures) and what runs it.
struct Command {
  CLI::App* app = nullptr;
  std::function<int(Context&)> run;
};

}  // namespace ftd::client

// What every ftctl command shares: the global flags (--addr, --timeout), their resolution against
// $FTD_ADDR and the config file, the connection to ftd, how errors are printed, and the exit codes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "client/job_client.h"
#include "proto/endpoints.h"

namespace ftd::client {

// Exit codes (docs/ftctl.md): a job's outcome for wait/watch/submit --wait, else whether the call worked.
inline constexpr int kExitOk = 0;
inline constexpr int kExitJobFailed = 1;
inline constexpr int kExitJobCancelled = 2;
inline constexpr int kExitCallFailed = 3;
inline constexpr int kExitUsage = 64;
inline constexpr int kExitInterrupted = 130;

// Prints "ftctl: CODE: message" on stderr; returns kExitCallFailed (kExitInterrupted, saying so,
// after Ctrl-C).
int Fail(const absl::Status& st);
// Prints "ftctl: message" on stderr; returns kExitUsage.
int Usage(const std::string& msg);

// The wall clock in Unix milliseconds (ages and durations of jobs).
int64_t NowUnixMs();

// The flags every command takes (before or after the command's name).
struct GlobalFlags {
  std::string addr;      // empty: $FTD_ADDR, the config file, a local socket found (LocalDaemon), 127.0.0.1:7070
  double timeout_s = 0;  // 0: the config file's, else 30
  std::string context;   // a named context of the config file (empty: $FTD_CONTEXT, the file's current_context)
  // TLS, over the context's: the CA that signed ftd's certificate (turns TLS on), a client
  // certificate and its key (mutual TLS).
  std::string ca_file, cert_file, key_file;
};

// Where ftctl looks for an ftd on this machine when no address is given, in this order, and what
// it found (a unix socket owned by the caller: another user's could be anyone's daemon):
//   1. scripts/run.sh's socket (runs/ftd.sock) in the current directory or the nearest parent that
//      has one: the project directory's daemon;
//   2. the systemd unit's /run/ftd/ftd.sock;
//   3. the socket in ftd's default data directory (ftd started with no --data-dir).
struct LocalDaemon {
  std::string address;        // "unix:/path" of the first socket found; empty: none
  std::string source;         // where it came from, for messages
  std::string project;        // the nearest project directory (scripts/run.sh and runs/), even with no socket
  std::vector<std::string> looked;  // every place looked at, for messages
};
LocalDaemon FindLocalDaemon();

// How to start (again) the ftd that `address` names, for the message of an unreachable daemon: its
// own data directory for a socket whose directory says which (run.sh's, ftd's default, a data
// directory holding ftd.db), else the command with what to fill in.
std::string StartHint(const std::string& address, const LocalDaemon& local);

// A gRPC target from what a user typed: "localhost" -> "localhost:7070", "[::1]" and "::1" ->
// "[::1]:7070", "host:port" as it is; "unix:/path", "unix-abstract:..." and URIs ("dns:///h:p") pass
// through. INVALID_ARGUMENT for an empty address or a port that is not a number in 1..65535.
absl::StatusOr<std::string> NormalizeAddress(const std::string& addr);

// The config file's path: $FTCTL_CONFIG, else $XDG_CONFIG_HOME/ftd/ftctl.json, else
// ~/.config/ftd/ftctl.json ("" when none can be named).
std::string ConfigPath();

// The connection settings from the flags, the environment and the config file, in that order of
// precedence (docs/ftctl.md). The config file names contexts, like kubeconfig:
//   {"current_context": "lab", "timeout_s": 30,
//    "contexts": {"lab": {"addr": "gpu-box:7070", "ca_file": "ca.pem", "token_file": "token",
//                         "cert_file": "me.pem", "key_file": "me.key", "tls": true}}}
// (relative files against the config file's folder). INVALID_ARGUMENT naming the file for one that
// does not parse, one named by $FTCTL_CONFIG that cannot be read, an unknown context or key, and an
// unreadable token file. The token is read here, from the context's token_file or $FTD_TOKEN_FILE; a
// token file that group or others may read gets a warning on stderr naming it and `chmod 600`.
absl::StatusOr<ClientOptions> ResolveOptions(const GlobalFlags& flags);

// What a command runs with: the resolved options and the client (which connects on its first call).
class Context {
 public:
  explicit Context(ClientOptions opts) : client_(std::move(opts)) {}
  const ClientOptions& options() const { return client_.options(); }
  JobClient& client() { return client_; }

 private:
  JobClient client_;
};

// Ctrl-C (SIGINT) and SIGTERM: BlockInterruptSignals() first thing in main (before gRPC starts any
// thread), then an InterruptHandler takes them in a thread of its own and interrupts the call in
// flight. Interrupted() says whether that happened; Fail() then exits with kExitInterrupted.
void BlockInterruptSignals();
bool Interrupted();
class InterruptHandler {
 public:
  explicit InterruptHandler(JobClient* client);
  ~InterruptHandler();
  InterruptHandler(const InterruptHandler&) = delete;
  InterruptHandler& operator=(const InterruptHandler&) = delete;

 private:
  JobClient* client_;
  std::thread thread_;
};

// A command: its subcommand (with its flags bound to state the runner captures) and what runs it.
struct Command {
  CLI::App* app = nullptr;
  std::function<int(Context&)> run;
};

}  // namespace ftd::client

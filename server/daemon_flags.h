// ftd's command line: every flag with its default and help text, the `ftd token` verb's
// subcommands, and the checks that turn the flags' text (durations, user limits, roots, the
// workers' user) into the values the daemon is built from. Parsing and checking only: nothing here
// opens a database, a socket or a GPU; main.cc builds the daemon from what it returns.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "server/auth/call_limits.h"
#include "server/auth/connection_limits.h"
#include "server/api/listen_config.h"
#include "server/auth/offline_tokens.h"
#include "server/policy/quotas.h"
#include "server/executors/local/worker_launcher.h"
#include "spec/sandbox.h"

namespace ftd::server {

// The flags as parsed, each with its default.
struct DaemonFlags {
  std::string listen = "127.0.0.1:7070", metrics_listen = "127.0.0.1:7071";
  std::string data_dir;  // default: $XDG_STATE_HOME/ftd, ~/.local/state/ftd, or ./ftd-data
  std::string worker;    // default: the ftd-worker beside ftd (or in ../worker/)
  std::string pid_file;  // written once ftd serves, removed when it stops; empty: none
  std::string restart_policy = "requeue";
  int gpus = -1, max_queued = 1000, max_attempts = 3;
  double grace_s = 10, heartbeat_s = 30, backoff_s = 2, drain_s = 30, progress_s = 600;  // seconds
  bool paused = false;
  std::string worker_cgroup = "auto";
  int64_t worker_memory_max = 0;  // bytes; 0: 90% of RAM
  std::string worker_user;
  bool workers_as_owner = false;
  ListenConfig lc;
  std::vector<std::string> admins;
  int priority_cap = 100;
  std::string retention;  // a duration; empty: keep
  ftd::spec::SandboxConfig sandbox;
  CallLimitsConfig limits;
  ConnectionLimitsConfig connections{0, 64};  // total 0: as many as the descriptor limit leaves room for
  double handshake_s = 10, idle_connection_s = 60;  // seconds
  int jobs_per_gpu = 1;
  double gpu_memory_gib = 0, gpu_margin_gib = 2;
  std::string default_limits = "none", quota_window = "24h", half_life = "24h";
  std::vector<std::string> user_limits;
};

// `ftd token create|list|revoke`: its subcommands and what they parsed.
struct TokenFlags {
  CLI::App* token = nullptr;
  CLI::App* create = nullptr;
  CLI::App* list = nullptr;
  CLI::App* revoke = nullptr;
  TokenCommand tc;
  std::string ttl;  // a duration; empty: the default
};

// Registers every flag of `f` (and the token verb's, in `t`) on `app`; both outlive the parse.
void AddDaemonFlags(CLI::App& app, DaemonFlags* f, TokenFlags* t);

// What the flags' text means, checked once at start.
struct CheckedFlags {
  QuotaConfig quotas;
  int64_t retention_ms = 0;            // 0: keep finished jobs
  std::optional<WorkerUser> run_as;    // --worker-user
};
// Checks the flags that need more than CLI11's checks (and resolves --read-only-root in place).
// An error's message is the whole line after "ftd: ", naming the flag.
absl::StatusOr<CheckedFlags> CheckDaemonFlags(DaemonFlags& f);

// Runs the parsed `ftd token` verb on DATA_DIR/auth.db; returns ftd's exit code.
int RunTokenVerb(TokenFlags& t, const std::string& data_dir);

}  // namespace ftd::server

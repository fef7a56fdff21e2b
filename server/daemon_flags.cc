// ftd's command line (daemon_flags.h): the flags' registration, their defaults that depend on the
// host (the data directory, the worker binary), the checks that need more than CLI11's, and the
// `ftd token` verb run on the data directory's auth.db.
#include "server/daemon_flags.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "proto/endpoints.h"
#include "server/auth/auth.h"
#include "server/auth/auth_store.h"
#include "server/common/clock.h"
#include "spec/duration.h"

namespace ftd::server {
namespace fs = std::filesystem;

namespace {

std::string DefaultWorkerBinary() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "ftd-worker";
  const fs::path self = fs::path(std::string(buf, static_cast<size_t>(n))).parent_path();
  for (const fs::path& p : {self / "ftd-worker", self.parent_path() / "worker" / "ftd-worker"}) {
    if (fs::exists(p)) return p.string();
  }
  return "ftd-worker";
}

// `flag: message` as one error, for the line main prints after "ftd: ".
absl::Status FlagError(const std::string& flag, const absl::Status& st) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", st.message()));
}

}  // namespace

void AddDaemonFlags(CLI::App& app, DaemonFlags* f, TokenFlags* t) {
  f->data_dir = ftd::DefaultDataDir();
  f->worker = DefaultWorkerBinary();
  app.add_option("--listen", f->listen, "gRPC address for clients (host:port)")->capture_default_str();
  app.add_option("--metrics-listen", f->metrics_listen, "HTTP address of /metrics (empty: off)")->capture_default_str();
  app.add_option("--data-dir", f->data_dir, "SQLite database, worker socket, job logs and checkpoints")->capture_default_str();
  app.add_option("--worker", f->worker, "ftd-worker binary")->capture_default_str();
  app.add_option("--pid-file", f->pid_file,
                 "write ftd's pid to this file once it serves, and remove the file when it stops (scripts/run.sh)");
  app.add_option("--gpus", f->gpus, "GPU slots (-1: the CUDA device count; 0: one CPU slot)")->capture_default_str();
  app.add_option("--max-queued", f->max_queued, "queued jobs beyond which SubmitJob answers RESOURCE_EXHAUSTED")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-attempts", f->max_attempts, "default attempts per job for infrastructure failures")
      ->check(CLI::Range(1, 20))->capture_default_str();
  app.add_option("--grace-s", f->grace_s, "cancel: seconds between SIGTERM and SIGKILL")->capture_default_str();
  app.add_option("--heartbeat-timeout-s", f->heartbeat_s, "a worker silent this long is killed (LOST_HEARTBEAT)")
      ->capture_default_str();
  app.add_option("--progress-timeout-s", f->progress_s,
                 "a worker with no step and no load/checkpoint progress this long is stuck: killed (NO_PROGRESS); 0: off")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--backoff-s", f->backoff_s, "first retry delay; doubles per attempt, at most 60 s")->capture_default_str();
  app.add_option("--drain-timeout-s", f->drain_s, "SIGTERM: how long running workers get to stop")->capture_default_str();
  app.add_option("--restart-policy", f->restart_policy, "jobs found RUNNING at start: requeue or fail")
      ->check(CLI::IsMember({"requeue", "fail"}))->capture_default_str();
  app.add_flag("--paused", f->paused, "start with the scheduler paused (ftctl resume starts it)");
  app.add_option("--worker-cgroup", f->worker_cgroup,
                 "parent cgroup of the workers' memory-limited cgroups: auto (under ftd's own, where it can), off, "
                 "or a directory in a cgroup v2 or v1 memory hierarchy")
      ->capture_default_str();
  app.add_option("--worker-memory-max", f->worker_memory_max,
                 "memory limit of each worker's cgroup, and the bound on CPU jobs at submit (e.g. 16GiB; 0: 90% of RAM)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--worker-user", f->worker_user,
                 "run workers as this unprivileged user (ftd must be root): each job's directory is given to it "
                 "when its worker starts; the roots must be readable, and the user roots writable, by it "
                 "(docs/security.md)");
  app.add_flag("--workers-as-owner", f->workers_as_owner,
               "run the workers of a job a local user submitted over the unix socket as that user (uid, groups); "
               "other jobs (tokens, certificates, root) run as --worker-user, which is then required");
  app.add_option("--socket", f->lc.socket,
                 "unix socket for local users, identified by uid (default: $RUNTIME_DIRECTORY/ftd.sock under "
                 "systemd, else DATA_DIR/ftd.sock)");
  app.add_option("--tls-cert", f->lc.tls_cert, "PEM certificate chain for --listen (TLS)");
  app.add_option("--tls-key", f->lc.tls_key, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", f->lc.tls_client_ca,
                 "PEM CA bundle: clients presenting a certificate it signed are the certificate's CN (mutual TLS)");
  app.add_flag("--insecure-listen-without-tls", f->lc.insecure,
               "allow --listen on a non-loopback address without TLS: tokens then cross the network in clear");
  app.add_option("--admin", f->admins, "a local user or certificate CN with the admin role (repeatable; root and "
                                    "ftd's own user always are)");
  app.add_option("--max-user-priority", f->priority_cap, "the highest priority a non-admin may submit with")
      ->capture_default_str();
  app.add_option("--retention", f->retention,
                 "delete finished jobs and their files this long after they ended: 30d, 12h, 90m (default: keep)");
  app.add_option("--user-root", f->sandbox.user_root,
                 "each user's writable directory, a pattern with {user} (e.g. /srv/ftd/users/{user}): relative spec "
                 "paths are taken against it, outputs (checkpoint.dir, data.cache_dir) must lie under it");
  app.add_option("--read-only-root", f->sandbox.read_only_roots,
                 "a shared directory every job may read, e.g. /srv/models (repeatable). With no root at all, spec "
                 "paths are not confined (docs/security.md)");
  app.add_option("--max-calls-per-s-per-user", f->limits.user_rate,
                 "calls per second a non-admin user may sustain, in bursts of twice as many (0: no limit)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-calls-per-s-per-connection", f->limits.connection_rate,
                 "calls per second one connection of a non-admin may sustain, in bursts of twice as many (0: no limit)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-streams-per-user", f->limits.user_streams,
                 "streaming calls (watch, logs, trace) a non-admin user may have open at once (0: no limit)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-streams-per-connection", f->limits.connection_streams,
                 "streaming calls one connection of a non-admin may have open at once (0: no limit)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-streams-per-admin", f->limits.admin_streams,
                 "streaming calls one admin may have open at once (each holds a daemon thread; 0: no limit)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-connections", f->connections.total,
                 "client connections open at once, both listeners; TCP peers together get three quarters (0: as "
                 "many as the descriptor limit leaves room for, at most 4096; checked at start)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-connections-per-peer", f->connections.per_peer,
                 "client connections one local user (root and ftd's user aside) or one TCP address may hold (0: no "
                 "limit)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--handshake-timeout-s", f->handshake_s,
                 "a TCP connection that has not finished its TLS handshake and HTTP/2 preface by then is closed")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--idle-connection-timeout-s", f->idle_connection_s,
                 "a connection with no call open this long (one that never made a call included) is closed; clients "
                 "reconnect when they next call")
      ->check(CLI::PositiveNumber)->capture_default_str();
  // ftd token create|list|revoke: on auth.db directly, the daemon running or not.
  t->token = app.add_subcommand("token", "Create, list and revoke bearer tokens on DATA_DIR/auth.db directly "
                                            "(with ftd stopped or running; docs/security.md)");
  t->token->require_subcommand(1);
  t->create = t->token->add_subcommand("create", "Issue a token for USER; its secret is printed once, on stdout");
  t->create->add_option("user", t->tc.user, "the user the token authenticates")->required();
  t->create->add_option("--role", t->tc.role, "user or admin")->check(CLI::IsMember({"user", "admin"}))->capture_default_str();
  t->create->add_option("--ttl", t->ttl, "lifetime: 90d, 12h, 30m (default 90d)");
  t->create->add_option("--description", t->tc.description, "what the token is for (at most 200 characters)");
  t->list = t->token->add_subcommand("list", "List tokens (never their secrets)");
  t->list->add_option("--user", t->tc.user, "only this user's");
  t->list->add_flag("--all", t->tc.all, "also revoked and expired tokens");
  t->revoke = t->token->add_subcommand("revoke", "Revoke a token by its id (ftd token list)");
  t->revoke->add_option("id", t->tc.id, "token id")->required();
  for (CLI::App* sub : {t->token, t->create, t->list, t->revoke}) sub->fallthrough();  // --data-dir after the verb
  app.add_option("--jobs-per-gpu", f->jobs_per_gpu,
                 "jobs one GPU may run at once, packed while their predicted peak memory fits the GPU")
      ->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--gpu-memory-gib", f->gpu_memory_gib,
                 "memory of each GPU for packing and the bound at submit (0: the smallest GPU's, as CUDA reports it)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--gpu-margin-gib", f->gpu_margin_gib, "memory kept free on a GPU that runs more than one job")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--user-limits", f->default_limits,
                 "every user's limits: queued=N,running=N,gpu-hours=X (any of them), or none")
      ->capture_default_str();
  app.add_option("--user-limit", f->user_limits, "one user's limits instead: USER:queued=N,running=N,gpu-hours=X (repeatable)");
  app.add_option("--quota-window", f->quota_window, "the rolling window of the gpu-hours limit: 24h, 7d")
      ->capture_default_str();
  app.add_option("--fair-share-half-life", f->half_life,
                 "fair share: among equal priorities the user with the least GPU usage decayed by this half-life "
                 "goes first (0: submission order)")
      ->capture_default_str();
}

absl::StatusOr<CheckedFlags> CheckDaemonFlags(DaemonFlags& f) {
  CheckedFlags out;
  QuotaConfig& quotas = out.quotas;
  auto d = ParseUserLimits(f.default_limits);
  if (!d.ok()) return FlagError("--user-limits", d.status());
  quotas.defaults = *d;
  for (const auto& u : f.user_limits) {
    auto l = ParseUserLimit(u);
    if (!l.ok()) return FlagError("--user-limit", l.status());
    quotas.users[l->first] = l->second;
  }
  auto w = ftd::spec::ParseAge(f.quota_window);
  if (!w.ok()) return FlagError("--quota-window", w.status());
  if (*w <= 0) return FlagError("--quota-window", absl::InvalidArgumentError("must be longer than 0 (e.g. 24h)"));
  quotas.window_ms = *w;
  if (f.half_life != "0") {
    auto h = ftd::spec::ParseAge(f.half_life);
    if (!h.ok()) return FlagError("--fair-share-half-life", h.status());
    quotas.half_life_ms = *h;
  } else {
    quotas.half_life_ms = 0;
  }
  if (!f.retention.empty()) {
    auto r = ftd::spec::ParseAge(f.retention);
    if (!r.ok()) return FlagError("--retention", r.status());
    out.retention_ms = *r;
  }
  if (auto st = f.sandbox.Validate(); !st.ok()) return st;
  if (f.workers_as_owner && f.worker_user.empty()) {
    return absl::InvalidArgumentError(
        "--workers-as-owner needs --worker-user NAME as well: the service user that runs the jobs of token and "
        "certificate users, of root, and of an admin submitting for someone else");
  }
  if (!f.worker_user.empty()) {
    auto u = LookUpWorkerUser(f.worker_user);
    if (!u.ok()) return u.status();
    out.run_as = *std::move(u);
  }
  return out;
}

int RunTokenVerb(TokenFlags& t, const std::string& data_dir) {
  t.tc.verb = t.create->parsed() ? TokenCommand::Verb::kCreate
              : t.list->parsed() ? TokenCommand::Verb::kList
                                 : TokenCommand::Verb::kRevoke;
  if (!t.ttl.empty()) {
    auto ms = ftd::spec::ParseAge(t.ttl);
    if (!ms.ok()) {
      std::cerr << "ftd token: --ttl: " << ms.status().message() << "\n";
      return 2;
    }
    t.tc.ttl_s = *ms / 1000;
  }
  std::error_code dir_ec;
  fs::create_directories(data_dir, dir_ec);
  auto tokens = AuthStore::Open((fs::path(data_dir) / "auth.db").string());
  if (!tokens.ok()) {
    std::cerr << "ftd token: " << tokens.status().message() << "\n";
    return 1;
  }
  RealClock now;
  if (auto st = RunTokenCommand(tokens->get(), t.tc, LocalUserName(::getuid()), now.UnixMs(), std::cout, std::cerr);
      !st.ok()) {
    std::cerr << "ftd token: " << st.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace ftd::server

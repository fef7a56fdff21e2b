// ftd: the fine-tuning job daemon. Serves ftd.v1.JobService, ftd.v1.AdminService and grpc.health.v1
// to local users on a unix socket (identity: the peer's uid) and to remote users over TCP (TLS,
// tokens or client certificates; docs/security.md), the worker protocol over a unix socket in its
// data directory, and Prometheus metrics over HTTP.
// SIGTERM/SIGINT drain: running workers are asked to stop (they checkpoint) and their jobs are
// requeued, within --drain-timeout-s; then the servers stop.
#include <cuda_runtime_api.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/exposer.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

#include "CLI/CLI.hpp"
#include "build_commit.h"
#include "server/admin_service.h"
#include "server/auth.h"
#include "server/auth_store.h"
#include "server/job_manager.h"
#include "server/memory_fit.h"
#include "server/listen_config.h"
#include "server/metrics.h"
#include "server/offline_tokens.h"
#include "server/process_metrics.h"
#include "server/service.h"
#include "server/store.h"
#include "server/worker_cgroups.h"
#include "server/worker_launcher.h"
#include "spec/duration.h"

namespace fs = std::filesystem;

namespace {

int DetectGpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// The smallest memory of the first `gpus` GPUs (a job may get any of them); 0 if unknown.
int64_t GpuMemoryBytes(int gpus) {
  int64_t least = 0;
  for (int i = 0; i < gpus; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) return 0;
    const auto total = static_cast<int64_t>(p.totalGlobalMem);
    least = least == 0 ? total : std::min(least, total);
  }
  return least;
}

// major * 10 + minor of the least capable of the first `gpus` GPUs; 0 if unknown.
int GpuComputeCapability(int gpus) {
  int least = 0;
  for (int i = 0; i < gpus; ++i) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, i) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, i) != cudaSuccess) {
      return 0;
    }
    least = least == 0 ? major * 10 + minor : std::min(least, major * 10 + minor);
  }
  return least;
}

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

std::string DefaultDataDir() {
  if (const char* x = std::getenv("XDG_STATE_HOME"); x != nullptr && *x != '\0') return std::string(x) + "/ftd";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') return std::string(h) + "/.local/state/ftd";
  return "ftd-data";
}

// The data directory is its owner's only (0700), and so are the databases in it (0600): a
// directory or database an older ftd left more open is tightened at start. Workers of another user
// (`traversable`) may pass through the data directory and jobs/ (0711) to their job's directory
// and the worker socket, but list neither.
void TightenModes(const std::string& data_dir, bool traversable) {
  std::error_code ec;
  const fs::perms dir_mode = traversable ? fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec
                                         : fs::perms::owner_all;
  fs::permissions(data_dir, dir_mode, fs::perm_options::replace, ec);
  fs::permissions(fs::path(data_dir) / "jobs", dir_mode, fs::perm_options::replace, ec);
  for (const char* name : {"ftd.db", "ftd.db-wal", "ftd.db-shm", "auth.db", "auth.db-wal", "auth.db-shm"}) {
    const fs::path p = fs::path(data_dir) / name;
    if (fs::exists(p, ec)) fs::permissions(p, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace, ec);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Everything ftd and its workers create (databases, logs, checkpoints, traces) is its owner's only.
  ::umask(077);
  CLI::App app{"ftd: fine-tuning job daemon"};
  std::string listen = "127.0.0.1:7070", metrics_listen = "127.0.0.1:7071", data_dir = DefaultDataDir();
  std::string worker = DefaultWorkerBinary(), restart_policy = "requeue";
  int gpus = -1, max_queued = 1000, max_attempts = 3;
  double grace_s = 10, heartbeat_s = 30, backoff_s = 2, drain_s = 30, progress_s = 600;
  app.add_option("--listen", listen, "gRPC address for clients (host:port)")->capture_default_str();
  app.add_option("--metrics-listen", metrics_listen, "HTTP address of /metrics (empty: off)")->capture_default_str();
  app.add_option("--data-dir", data_dir, "SQLite database, worker socket, job logs and checkpoints")->capture_default_str();
  app.add_option("--worker", worker, "ftd-worker binary")->capture_default_str();
  app.add_option("--gpus", gpus, "GPU slots (-1: the CUDA device count; 0: one CPU slot)")->capture_default_str();
  app.add_option("--max-queued", max_queued, "queued jobs beyond which SubmitJob answers RESOURCE_EXHAUSTED")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-attempts", max_attempts, "default attempts per job for infrastructure failures")
      ->check(CLI::Range(1, 20))->capture_default_str();
  app.add_option("--grace-s", grace_s, "cancel: seconds between SIGTERM and SIGKILL")->capture_default_str();
  app.add_option("--heartbeat-timeout-s", heartbeat_s, "a worker silent this long is killed (LOST_HEARTBEAT)")
      ->capture_default_str();
  app.add_option("--progress-timeout-s", progress_s,
                 "a worker with no step and no load/checkpoint progress this long is stuck: killed (NO_PROGRESS); 0: off")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--backoff-s", backoff_s, "first retry delay; doubles per attempt, at most 60 s")->capture_default_str();
  app.add_option("--drain-timeout-s", drain_s, "SIGTERM: how long running workers get to stop")->capture_default_str();
  app.add_option("--restart-policy", restart_policy, "jobs found RUNNING at start: requeue or fail")
      ->check(CLI::IsMember({"requeue", "fail"}))->capture_default_str();
  bool paused = false;
  app.add_flag("--paused", paused, "start with the scheduler paused (ftctl resume starts it)");
  std::string worker_cgroup = "auto";
  int64_t worker_memory_max = 0;
  app.add_option("--worker-cgroup", worker_cgroup,
                 "parent cgroup of the workers' memory-limited cgroups: auto (under ftd's own, where it can), off, "
                 "or a directory in a cgroup v2 or v1 memory hierarchy")
      ->capture_default_str();
  app.add_option("--worker-memory-max", worker_memory_max,
                 "memory limit of each worker's cgroup, and the bound on CPU jobs at submit (e.g. 16GiB; 0: 90% of RAM)")
      ->transform(CLI::AsSizeValue(false));
  std::string worker_user;
  app.add_option("--worker-user", worker_user,
                 "run workers as this unprivileged user (ftd must be root): each job's directory is given to it "
                 "when its worker starts; the roots must be readable, and the user roots writable, by it "
                 "(docs/security.md)");
  ftd::server::ListenConfig lc;
  app.add_option("--socket", lc.socket,
                 "unix socket for local users, identified by uid (default: $RUNTIME_DIRECTORY/ftd.sock under "
                 "systemd, else DATA_DIR/ftd.sock)");
  app.add_option("--tls-cert", lc.tls_cert, "PEM certificate chain for --listen (TLS)");
  app.add_option("--tls-key", lc.tls_key, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", lc.tls_client_ca,
                 "PEM CA bundle: clients presenting a certificate it signed are the certificate's CN (mutual TLS)");
  app.add_flag("--insecure-listen-without-tls", lc.insecure,
               "allow --listen on a non-loopback address without TLS: tokens then cross the network in clear");
  std::vector<std::string> admins;
  app.add_option("--admin", admins, "a local user or certificate CN with the admin role (repeatable; root and "
                                    "ftd's own user always are)");
  int priority_cap = 100;
  app.add_option("--max-user-priority", priority_cap, "the highest priority a non-admin may submit with")
      ->capture_default_str();
  std::string retention;
  app.add_option("--retention", retention,
                 "delete finished jobs and their files this long after they ended: 30d, 12h, 90m (default: keep)");
  ftd::spec::SandboxConfig sandbox;
  app.add_option("--user-root", sandbox.user_root,
                 "each user's writable directory, a pattern with {user} (e.g. /srv/ftd/users/{user}): relative spec "
                 "paths are taken against it, outputs (checkpoint.dir, data.cache_dir) must lie under it");
  app.add_option("--read-only-root", sandbox.read_only_roots,
                 "a shared directory every job may read, e.g. /srv/models (repeatable). With no root at all, spec "
                 "paths are not confined (docs/security.md)");
  ftd::server::CallLimitsConfig limits;
  app.add_option("--max-calls-per-s-per-user", limits.user_rate,
                 "calls per second a non-admin user may sustain, in bursts of twice as many (0: no limit)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-calls-per-s-per-connection", limits.connection_rate,
                 "calls per second one connection of a non-admin may sustain, in bursts of twice as many (0: no limit)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-streams-per-user", limits.user_streams,
                 "streaming calls (watch, logs, trace) a non-admin user may have open at once (0: no limit)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-streams-per-connection", limits.connection_streams,
                 "streaming calls one connection of a non-admin may have open at once (0: no limit)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  // ftd token create|list|revoke: on auth.db directly, the daemon running or not.
  auto* token = app.add_subcommand("token", "Create, list and revoke bearer tokens on DATA_DIR/auth.db directly "
                                            "(with ftd stopped or running; docs/security.md)");
  token->require_subcommand(1);
  ftd::server::TokenCommand tc;
  std::string ttl;
  auto* create = token->add_subcommand("create", "Issue a token for USER; its secret is printed once, on stdout");
  create->add_option("user", tc.user, "the user the token authenticates")->required();
  create->add_option("--role", tc.role, "user or admin")->check(CLI::IsMember({"user", "admin"}))->capture_default_str();
  create->add_option("--ttl", ttl, "lifetime: 90d, 12h, 30m (default 90d)");
  create->add_option("--description", tc.description, "what the token is for (at most 200 characters)");
  auto* list = token->add_subcommand("list", "List tokens (never their secrets)");
  list->add_option("--user", tc.user, "only this user's");
  list->add_flag("--all", tc.all, "also revoked and expired tokens");
  auto* revoke = token->add_subcommand("revoke", "Revoke a token by its id (ftd token list)");
  revoke->add_option("id", tc.id, "token id")->required();
  for (CLI::App* sub : {token, create, list, revoke}) sub->fallthrough();  // --data-dir after the verb
  int jobs_per_gpu = 1;
  double gpu_memory_gib = 0, gpu_margin_gib = 2;
  app.add_option("--jobs-per-gpu", jobs_per_gpu,
                 "jobs one GPU may run at once, packed while their predicted peak memory fits the GPU")
      ->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--gpu-memory-gib", gpu_memory_gib,
                 "memory of each GPU for packing and the bound at submit (0: the smallest GPU's, as CUDA reports it)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--gpu-margin-gib", gpu_margin_gib, "memory kept free on a GPU that runs more than one job")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  std::string default_limits = "none", quota_window = "24h", half_life = "24h";
  std::vector<std::string> user_limits;
  app.add_option("--user-limits", default_limits,
                 "every user's limits: queued=N,running=N,gpu-hours=X (any of them), or none")
      ->capture_default_str();
  app.add_option("--user-limit", user_limits, "one user's limits instead: USER:queued=N,running=N,gpu-hours=X (repeatable)");
  app.add_option("--quota-window", quota_window, "the rolling window of the gpu-hours limit: 24h, 7d")
      ->capture_default_str();
  app.add_option("--fair-share-half-life", half_life,
                 "fair share: among equal priorities the user with the least GPU usage decayed by this half-life "
                 "goes first (0: submission order)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (token->parsed()) {
    tc.verb = create->parsed() ? ftd::server::TokenCommand::Verb::kCreate
              : list->parsed() ? ftd::server::TokenCommand::Verb::kList
                               : ftd::server::TokenCommand::Verb::kRevoke;
    if (!ttl.empty()) {
      auto ms = ftd::spec::ParseAge(ttl);
      if (!ms.ok()) {
        std::cerr << "ftd token: --ttl: " << ms.status().message() << "\n";
        return 2;
      }
      tc.ttl_s = *ms / 1000;
    }
    std::error_code dir_ec;
    fs::create_directories(data_dir, dir_ec);
    auto tokens = ftd::server::AuthStore::Open((fs::path(data_dir) / "auth.db").string());
    if (!tokens.ok()) {
      std::cerr << "ftd token: " << tokens.status().message() << "\n";
      return 1;
    }
    ftd::server::RealClock now;
    if (auto st = ftd::server::RunTokenCommand(tokens->get(), tc, ftd::server::LocalUserName(::getuid()), now.UnixMs(),
                                               std::cout, std::cerr);
        !st.ok()) {
      std::cerr << "ftd token: " << st.message() << "\n";
      return 1;
    }
    return 0;
  }
  ftd::server::QuotaConfig quotas;
  {
    auto fail = [](const std::string& flag, const absl::Status& st) {
      std::cerr << "ftd: " << flag << ": " << st.message() << "\n";
      return 2;
    };
    auto d = ftd::server::ParseUserLimits(default_limits);
    if (!d.ok()) return fail("--user-limits", d.status());
    quotas.defaults = *d;
    for (const auto& u : user_limits) {
      auto l = ftd::server::ParseUserLimit(u);
      if (!l.ok()) return fail("--user-limit", l.status());
      quotas.users[l->first] = l->second;
    }
    auto w = ftd::spec::ParseAge(quota_window);
    if (!w.ok()) return fail("--quota-window", w.status());
    if (*w <= 0) return fail("--quota-window", absl::InvalidArgumentError("must be longer than 0 (e.g. 24h)"));
    quotas.window_ms = *w;
    if (half_life != "0") {
      auto h = ftd::spec::ParseAge(half_life);
      if (!h.ok()) return fail("--fair-share-half-life", h.status());
      quotas.half_life_ms = *h;
    } else {
      quotas.half_life_ms = 0;
    }
  }
  int64_t retention_ms = 0;
  if (!retention.empty()) {
    auto d = ftd::spec::ParseAge(retention);
    if (!d.ok()) {
      std::cerr << "ftd: --retention: " << d.status().message() << "\n";
      return 2;
    }
    retention_ms = *d;
  }
  if (auto st = sandbox.Validate(); !st.ok()) {
    std::cerr << "ftd: " << st.message() << "\n";
    return 2;
  }
  std::optional<ftd::server::WorkerUser> run_as;
  if (!worker_user.empty()) {
    auto u = ftd::server::LookUpWorkerUser(worker_user);
    if (!u.ok()) {
      std::cerr << "ftd: " << u.status().message() << "\n";
      return 2;
    }
    run_as = *std::move(u);
  }
  lc.listen = listen;
  if (auto st = lc.Resolve(data_dir); !st.ok()) {
    std::cerr << "ftd: " << st.message() << "\n";
    return 1;
  }

  // Signals go to one thread (sigwait below); every other thread, and gRPC's, have them blocked.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::error_code ec;
  fs::create_directories(fs::path(data_dir) / "jobs", ec);
  if (ec) {
    std::cerr << "ftd: cannot create --data-dir " << data_dir << ": " << ec.message() << "\n";
    return 1;
  }
  data_dir = fs::canonical(data_dir).string();
  TightenModes(data_dir, run_as.has_value());
  if (lc.socket.empty()) lc.socket = (fs::path(data_dir) / "ftd.sock").string();
  auto store = ftd::server::Store::Open((fs::path(data_dir) / "ftd.db").string());
  if (!store.ok()) {
    std::cerr << "ftd: " << store.status().message() << "\n";
    return 1;
  }
  auto auth_store = ftd::server::AuthStore::Open((fs::path(data_dir) / "auth.db").string());
  if (!auth_store.ok()) {
    std::cerr << "ftd: " << auth_store.status().message() << "\n";
    return 1;
  }
  ftd::server::Metrics metrics;
  auto process_metrics = std::make_shared<ftd::server::ProcessCollector>(FTD_VERSION, FTD_COMMIT);
  std::unique_ptr<prometheus::Exposer> exposer;
  if (!metrics_listen.empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(metrics_listen);
      exposer->RegisterCollectable(metrics.registry());
      exposer->RegisterCollectable(process_metrics);
    } catch (const std::exception& e) {
      std::cerr << "ftd: cannot serve metrics on --metrics-listen " << metrics_listen << ": " << e.what() << "\n";
      return 1;
    }
  }
  ftd::server::ManagerConfig mc;
  mc.data_dir = data_dir;
  const std::string sock = (fs::path(data_dir) / "worker.sock").string();
  fs::remove(sock, ec);
  const int64_t ram = ftd::server::HostMemoryBytes();
  const int64_t worker_limit = worker_memory_max > 0 ? worker_memory_max : ram / 10 * 9;
  std::unique_ptr<ftd::server::WorkerCgroups> cgroups;
  if (worker_cgroup != "off") {
    auto cg = ftd::server::OpenWorkerCgroups(worker_cgroup, worker_limit);
    if (cg.ok()) {
      cgroups = std::move(*cg);
    } else if (worker_cgroup != "auto") {
      std::cerr << "ftd: --worker-cgroup " << worker_cgroup << ": " << cg.status().message() << "\n";
      return 1;
    } else {
      std::cerr << "ftd: workers run without a memory limit (" << cg.status().message()
                << "); an out-of-memory kill is told by its SIGKILL and /proc/vmstat (docs/api.md)" << std::endl;
    }
  }
  ftd::server::ProcessLauncher launcher(
      {worker, "unix:" + sock, (fs::path(data_dir) / "jobs").string(), cgroups.get(), run_as});
  ftd::server::RealClock clock;
  mc.gpus = gpus >= 0 ? gpus : DetectGpus();
  mc.max_queued = max_queued;
  mc.default_max_attempts = max_attempts;
  mc.grace_ms = static_cast<int>(grace_s * 1000);
  mc.heartbeat_timeout_ms = static_cast<int>(heartbeat_s * 1000);
  mc.backoff_base_ms = static_cast<int>(backoff_s * 1000);
  mc.progress_timeout_ms = static_cast<int64_t>(progress_s * 1000);
  mc.requeue_on_restart = restart_policy == "requeue";
  mc.paused = paused;
  mc.gpu_compute_capability = GpuComputeCapability(mc.gpus);
  mc.memory = {cgroups != nullptr ? std::min(ram, worker_limit) : ram,
               gpu_memory_gib > 0 ? static_cast<int64_t>(gpu_memory_gib * (int64_t{1} << 30)) : GpuMemoryBytes(mc.gpus)};
  mc.jobs_per_gpu = jobs_per_gpu;
  mc.gpu_margin_bytes = static_cast<int64_t>(gpu_margin_gib * (int64_t{1} << 30));
  mc.quotas = quotas;
  mc.retention_ms = retention_ms;
  mc.sandbox = sandbox;
  mc.retention_check_ms = std::clamp<int64_t>(retention_ms / 10, 1000, 3600'000);
  ftd::server::JobManager manager(mc, store->get(), &metrics, &launcher, &clock);

  std::atomic<bool> stopping{false};
  auto local = ftd::server::UnixListener::Listen(lc.socket);
  if (!local.ok()) {
    std::cerr << "ftd: " << local.status().message() << "\n";
    return 1;
  }
  ftd::server::AuthConfig ac;
  ac.admins = {admins.begin(), admins.end()};
  ac.daemon_uid = ::getuid();
  ac.client_certs = !lc.tls_client_ca.empty();
  ftd::server::Authenticator authenticator(ac, auth_store->get(), &clock, local->get());
  limits.user_burst = std::max(1.0, 2 * limits.user_rate);
  limits.connection_burst = std::max(1.0, 2 * limits.connection_rate);
  ftd::server::CallLimiter limiter(limits, &clock);
  ftd::server::CallAuth call_auth(&authenticator, auth_store->get(), &clock, &limiter);
  ftd::server::JobServiceImpl jobs(&manager, &stopping, &call_auth, priority_cap);
  ftd::server::AdminServiceImpl admin(&call_auth, auth_store->get(), &clock);
  ftd::server::WorkerServiceImpl workers(&manager);
  for (const ftd::server::ParsedService* s : {static_cast<const ftd::server::ParsedService*>(&jobs),
                                              static_cast<const ftd::server::ParsedService*>(&admin)}) {
    if (auto missing = s->Unregistered(); !missing.empty()) {
      std::cerr << "ftd: no handler registered for " << missing.front() << "\n";
      return 1;
    }
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder pub;
  int port = 0;
  auto creds = lc.Credentials();
  if (!creds.ok()) {
    std::cerr << "ftd: " << creds.status().message() << "\n";
    return 1;
  }
  if (!lc.listen.empty()) pub.AddListeningPort(lc.listen, *creds, &port);
  // gRPC sets SO_REUSEPORT by default: a second ftd on a taken port would then start and share it.
  pub.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  pub.RegisterService(&jobs);
  pub.RegisterService(&admin);
  pub.SetMaxReceiveMessageSize(4 << 20);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(call_auth.InterceptorFactory());
  pub.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = pub.BuildAndStart();
  if (server == nullptr || (!lc.listen.empty() && port == 0)) {
    std::cerr << "ftd: cannot listen on --listen " << listen << " (in use, or not host:port)\n";
    return 1;
  }
  (*local)->Serve(server.get());
  grpc::ServerBuilder priv;
  priv.AddListeningPort("unix:" + sock, grpc::InsecureServerCredentials());
  priv.RegisterService(&workers);
  std::unique_ptr<grpc::Server> worker_server = priv.BuildAndStart();
  if (worker_server == nullptr) {
    std::cerr << "ftd: cannot listen on unix:" << sock << "\n";
    return 1;
  }
  fs::permissions(sock, fs::perms::owner_read | fs::perms::owner_write, ec);
  // The workers' user connects to it (each attempt still proves itself with its token).
  if (run_as.has_value() && ::chown(sock.c_str(), run_as->uid, run_as->gid) != 0) {
    std::cerr << "ftd: cannot give the worker socket " << sock << " to --worker-user " << run_as->name << ": "
              << std::strerror(errno) << "\n";
    return 1;
  }
  if (auto st = manager.Start(); !st.ok()) {
    std::cerr << "ftd: " << st.message() << "\n";
    return 1;
  }
  std::cerr << "ftd: serving on unix:" << lc.socket << " (local users), "
            << (lc.listen.empty() ? std::string("no TCP") : lc.Describe(port)) << ", metrics on "
            << (metrics_listen.empty() ? "(off)" : metrics_listen) << ", " << manager.slots() << " slot(s) ("
            << (mc.gpus > 0 ? "GPU" : "CPU") << "), data in " << data_dir << "; workers: "
            << (cgroups != nullptr ? cgroups->Describe() : "no cgroup")
            << (run_as.has_value() ? absl::StrCat(", as user ", run_as->name, " (uid ", run_as->uid, ")") : "")
            << std::endl;

  int sig = 0;
  sigwait(&sigs, &sig);
  std::cerr << "ftd: signal " << sig << ": draining (up to " << drain_s << " s)" << std::endl;
  stopping.store(true);
  manager.CloseWatches();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(drain_s * 1000));
  manager.Drain(deadline);
  (*local)->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  worker_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  std::cerr << "ftd: stopped" << std::endl;
  return 0;
}

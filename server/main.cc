// ftd: the fine-tuning job daemon. Serves ftd.v1.JobService, ftd.v1.AdminService and grpc.health.v1
// to local users on a unix socket (identity: the peer's uid) and to remote users over TCP (TLS,
// tokens or client certificates; docs/security.md), the worker protocol over a unix socket in its
// data directory, and Prometheus metrics over HTTP.
// SIGTERM/SIGINT drain: running workers are asked to stop (they checkpoint) and their jobs are
// requeued, within --drain-timeout-s; then the servers stop.
// This file wires the daemon together from its flags (daemon_flags.h): stores, metrics, the worker
// launcher, the job manager, the services and their listeners, then waits for a signal and drains.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/exposer.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "build_commit.h"
#include "server/api/admin_service.h"
#include "server/auth/auth.h"
#include "server/auth/auth_store.h"
#include "server/daemon_flags.h"
#include "server/data_dir.h"
#include "server/common/filesystem_info.h"
#include "server/gpu_probe.h"
#include "server/api/handshake_log.h"
#include "server/jobs/job_manager.h"
#include "server/common/log.h"
#include "server/policy/memory_fit.h"
#include "server/api/listen_config.h"
#include "server/jobs/metrics.h"
#include "server/process_metrics.h"
#include "server/api/service.h"
#include "server/store/store.h"
#include "server/api/tcp_listener.h"
#include "server/executors/local/worker_cgroups.h"
#include "server/executors/local/worker_launcher.h"

namespace fs = std::filesystem;
using ftd::server::FtdLog;

int main(int argc, char** argv) {
  // Everything ftd and its workers create (databases, logs, checkpoints, traces) is its owner's only.
  ::umask(077);
  CLI::App app{"ftd: fine-tuning job daemon"};
  ftd::server::DaemonFlags flags;
  ftd::server::TokenFlags token;
  ftd::server::AddDaemonFlags(app, &flags, &token);
  CLI11_PARSE(app, argc, argv);
  if (token.token->parsed()) return ftd::server::RunTokenVerb(token, flags.data_dir);
  auto checked = ftd::server::CheckDaemonFlags(flags);
  if (!checked.ok()) {
    FtdLog() << checked.status().message();
    return 2;
  }
  const ftd::server::QuotaConfig& quotas = checked->quotas;
  const int64_t retention_ms = checked->retention_ms;
  const std::optional<ftd::server::WorkerUser>& run_as = checked->run_as;
  // The flags by their short names, as the wiring below reads them.
  const std::string& listen = flags.listen;
  const std::string& metrics_listen = flags.metrics_listen;
  std::string data_dir = flags.data_dir;
  ftd::server::ListenConfig& lc = flags.lc;
  ftd::server::CallLimitsConfig& limits = flags.limits;
  const std::string& worker_cgroup = flags.worker_cgroup;
  const double drain_s = flags.drain_s;
  lc.listen = listen;
  if (auto st = lc.Resolve(data_dir); !st.ok()) {
    FtdLog() << st.message();
    return 1;
  }

  // libprotobuf's own messages (a request it could not parse) go to ftd's log, a few a minute.
  ftd::server::RealClock log_clock;
  ftd::server::RouteProtobufLog(&log_clock, 10);

  // Signals go to one thread (sigwait below); every other thread, and gRPC's, have them blocked.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // A start-up step that failed on a full disk (the databases' write-ahead logs, the socket, a
  // directory) is told as one line about the disk, whichever step it was.
  const auto start_failed = [&](const std::string& message) {
    if (auto full = ftd::server::FullDisk(data_dir)) {
      FtdLog() << "cannot start: the disk of the data directory " << data_dir << " is full (" << *full
               << "): free space there, or give --data-dir a directory on a disk with room";
    } else {
      FtdLog() << message;
    }
    return 1;
  };
  std::error_code ec;
  fs::create_directories(fs::path(data_dir) / "jobs", ec);
  if (ec) return start_failed(absl::StrCat("cannot create --data-dir ", data_dir, ": ", ec.message()));
  data_dir = fs::canonical(data_dir).string();
  ftd::server::TightenDataDirModes(data_dir, run_as.has_value());
  if (lc.socket.empty()) lc.socket = (fs::path(data_dir) / "ftd.sock").string();
  auto store = ftd::server::Store::Open((fs::path(data_dir) / "ftd.db").string());
  if (!store.ok()) return start_failed(std::string(store.status().message()));
  auto auth_store = ftd::server::AuthStore::Open((fs::path(data_dir) / "auth.db").string());
  if (!auth_store.ok()) return start_failed(std::string(auth_store.status().message()));
  ftd::server::Metrics metrics;
  auto process_metrics = std::make_shared<ftd::server::ProcessCollector>(FTD_VERSION, FTD_COMMIT);
  std::unique_ptr<prometheus::Exposer> exposer;
  if (!metrics_listen.empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(metrics_listen);
      exposer->RegisterCollectable(metrics.registry());
      exposer->RegisterCollectable(process_metrics);
    } catch (const std::exception& e) {
      FtdLog() << "cannot serve metrics on --metrics-listen " << metrics_listen << ": " << e.what();
      return 1;
    }
  }
  ftd::server::ManagerConfig mc;
  mc.data_dir = data_dir;
  const std::string sock = (fs::path(data_dir) / "worker.sock").string();
  fs::remove(sock, ec);
  const int64_t ram = ftd::server::HostMemoryBytes();
  const int64_t worker_limit = flags.worker_memory_max > 0 ? flags.worker_memory_max : ram / 10 * 9;
  std::unique_ptr<ftd::server::WorkerCgroups> cgroups;
  if (worker_cgroup != "off") {
    auto cg = ftd::server::OpenWorkerCgroups(worker_cgroup, worker_limit);
    if (cg.ok()) {
      cgroups = std::move(*cg);
    } else if (worker_cgroup != "auto") {
      FtdLog() << "--worker-cgroup " << worker_cgroup << ": " << cg.status().message();
      return 1;
    } else {
      FtdLog() << "workers run without a memory limit (" << cg.status().message()
               << "); an out-of-memory kill is told by its SIGKILL and /proc/vmstat (docs/api.md)";
    }
  }
  ftd::server::ProcessLauncher launcher(
      {flags.worker, "unix:" + sock, (fs::path(data_dir) / "jobs").string(), cgroups.get(), run_as,
       flags.workers_as_owner});
  ftd::server::RealClock clock;
  mc.gpus = flags.gpus >= 0 ? flags.gpus : ftd::server::DetectGpus();
  mc.max_queued = flags.max_queued;
  mc.default_max_attempts = flags.max_attempts;
  mc.grace_ms = static_cast<int>(flags.grace_s * 1000);
  mc.heartbeat_timeout_ms = static_cast<int>(flags.heartbeat_s * 1000);
  mc.backoff_base_ms = static_cast<int>(flags.backoff_s * 1000);
  mc.progress_timeout_ms = static_cast<int64_t>(flags.progress_s * 1000);
  mc.requeue_on_restart = flags.restart_policy == "requeue";
  mc.paused = flags.paused;
  mc.gpu_compute_capability = ftd::server::GpuComputeCapability(mc.gpus);
  mc.memory = {cgroups != nullptr ? std::min(ram, worker_limit) : ram,
               flags.gpu_memory_gib > 0 ? static_cast<int64_t>(flags.gpu_memory_gib * (int64_t{1} << 30))
                                        : ftd::server::GpuMemoryBytes(mc.gpus)};
  mc.jobs_per_gpu = flags.jobs_per_gpu;
  mc.gpu_margin_bytes = static_cast<int64_t>(flags.gpu_margin_gib * (int64_t{1} << 30));
  mc.quotas = quotas;
  mc.retention_ms = retention_ms;
  mc.sandbox = flags.sandbox;
  mc.workers_uid = run_as.has_value() ? run_as->uid : ::geteuid();
  mc.workers_as_owner = flags.workers_as_owner;
  mc.retention_check_ms = std::clamp<int64_t>(retention_ms / 10, 1000, 3600'000);
  ftd::server::JobManager manager(mc, store->get(), &metrics, &launcher, &clock);

  std::atomic<bool> stopping{false};
  auto local = ftd::server::UnixListener::Listen(lc.socket);
  if (!local.ok()) return start_failed(std::string(local.status().message()));
  ftd::server::AuthConfig ac;
  ac.admins = {flags.admins.begin(), flags.admins.end()};
  ac.daemon_uid = ::getuid();
  ac.client_certs = !lc.tls_client_ca.empty();
  ftd::server::Authenticator authenticator(ac, auth_store->get(), &clock, local->get());
  limits.user_burst = std::max(1.0, 2 * limits.user_rate);
  limits.connection_burst = std::max(1.0, 2 * limits.connection_rate);
  ftd::server::CallLimiter limiter(limits, &clock);
  ftd::server::CallAuth call_auth(&authenticator, auth_store->get(), &clock, &limiter);
  call_auth.StartAuditFlusher();
  ftd::server::JobServiceImpl jobs(&manager, &stopping, &call_auth, flags.priority_cap);
  ftd::server::AdminServiceImpl admin(&call_auth, auth_store->get(), &clock);
  ftd::server::WorkerServiceImpl workers(&manager);
  for (const ftd::server::ParsedService* s : {static_cast<const ftd::server::ParsedService*>(&jobs),
                                              static_cast<const ftd::server::ParsedService*>(&admin)}) {
    if (auto missing = s->Unregistered(); !missing.empty()) {
      FtdLog() << "no handler registered for " << missing.front();
      return 1;
    }
  }
  // A failed TLS handshake on --listen: one line naming the peer, rate-limited (handshake_log.h).
  ftd::server::InstallHandshakeLog([](const std::string& line) {
    const absl::string_view text = absl::StripPrefix(line, "ftd: ");
    ftd::server::WriteLogLine(std::string_view(text.data(), text.size()));
  });
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder pub;
  auto creds = lc.Credentials();
  if (!creds.ok()) {
    FtdLog() << creds.status().message();
    return 1;
  }
  // ftd accepts TCP connections itself (server/api/tcp_listener.h) and hands them to gRPC, which does the
  // TLS handshake: a connection that has not finished it (and the HTTP/2 preface) within the
  // handshake timeout is closed, and one with no call open for the idle timeout (one that never
  // made a call included) too, on either listener.
  std::unique_ptr<ftd::server::TcpListener> tcp;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> tcp_acceptor;
  if (!lc.listen.empty()) {
    auto t = ftd::server::TcpListener::Listen(lc.listen);
    if (!t.ok()) {
      FtdLog() << t.status().message();
      return 1;
    }
    tcp = std::move(*t);
    tcp_acceptor = pub.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, *creds);
  }
  pub.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, static_cast<int>(flags.handshake_s * 1000));
  pub.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, static_cast<int>(flags.idle_connection_s * 1000));
  pub.RegisterService(&jobs);
  pub.RegisterService(&admin);
  pub.SetMaxReceiveMessageSize(4 << 20);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(call_auth.InterceptorFactory());
  pub.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = pub.BuildAndStart();
  if (server == nullptr) {
    FtdLog() << "cannot start the gRPC server for --listen " << listen;
    return 1;
  }
  grpc::ServerBuilder priv;
  priv.AddListeningPort("unix:" + sock, grpc::InsecureServerCredentials());
  priv.RegisterService(&workers);
  std::unique_ptr<grpc::Server> worker_server = priv.BuildAndStart();
  if (worker_server == nullptr) return start_failed(absl::StrCat("cannot listen on unix:", sock));
  // With --workers-as-owner any local user's workers connect (each attempt still proves itself with
  // its token).
  fs::permissions(sock, flags.workers_as_owner ? fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                                                     fs::perms::group_write | fs::perms::others_read |
                                                     fs::perms::others_write
                                               : fs::perms::owner_read | fs::perms::owner_write,
                  ec);
  // The workers' user connects to it (each attempt still proves itself with its token).
  if (run_as.has_value() && ::chown(sock.c_str(), run_as->uid, run_as->gid) != 0) {
    FtdLog() << "cannot give the worker socket " << sock << " to --worker-user " << run_as->name << ": "
             << std::strerror(errno);
    return 1;
  }
  // Client connections within the descriptor limit, with room left for what the daemon opens itself
  // (counted now that its databases, listeners and servers are open) and for its workers.
  rlimit nofile{};
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  auto budget = ftd::server::ConnectionBudget(flags.connections.total, nofile.rlim_cur,
                                              ftd::server::OpenDescriptors(), manager.slots());
  if (!budget.ok()) {
    FtdLog() << budget.status().message();
    return 1;
  }
  ftd::server::ConnectionLimits connection_limits({*budget, flags.connections.per_peer}, &clock);
  (*local)->Serve(server.get(), &connection_limits, ::getuid());
  if (tcp != nullptr) tcp->Serve(tcp_acceptor.get(), &connection_limits);
  if (auto st = manager.Start(); !st.ok()) {
    FtdLog() << st.message();
    return 1;
  }
  // The pid file says "this ftd serves": written now, removed when it stops (if it is still ours).
  const std::string pid_text = absl::StrCat(::getpid(), "\n");
  if (!flags.pid_file.empty()) {
    ec.clear();
    const std::string tmp = flags.pid_file + ".tmp";
    std::ofstream out(tmp);
    out << pid_text << std::flush;
    if (!out) ec = std::make_error_code(std::errc::io_error);
    out.close();
    if (!ec) fs::rename(tmp, flags.pid_file, ec);
    if (ec) return start_failed(absl::StrCat("cannot write --pid-file ", flags.pid_file, ": ", ec.message()));
  }

  FtdLog() << "serving on unix:" << lc.socket << " (local users), "
           << (lc.listen.empty() ? std::string("no TCP") : lc.Describe(tcp->port())) << ", at most " << *budget
           << " connections (" << connection_limits.per_peer_limit() << " per peer), metrics on "
           << (metrics_listen.empty() ? "(off)" : metrics_listen) << ", " << manager.slots() << " slot(s) ("
           << (mc.gpus > 0 ? "GPU" : "CPU") << "), data in " << data_dir << "; workers: "
           << (cgroups != nullptr ? cgroups->Describe() : "no cgroup")
           << (run_as.has_value() ? absl::StrCat(", as user ", run_as->name, " (uid ", run_as->uid, ")",
                                              flags.workers_as_owner ? " or as the job's local owner" : "")
                               : "");

  int sig = 0;
  sigwait(&sigs, &sig);
  FtdLog() << "signal " << sig << ": draining (up to " << drain_s << " s)";
  stopping.store(true);
  manager.CloseWatches();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(drain_s * 1000));
  manager.Drain(deadline);
  (*local)->Stop();
  if (tcp != nullptr) tcp->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  worker_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (!flags.pid_file.empty()) {
    std::ifstream in(flags.pid_file);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text == pid_text) fs::remove(flags.pid_file, ec);
  }
  FtdLog() << "stopped";
  return 0;
}

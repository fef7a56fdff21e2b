// ftctl: the command-line client of ftd (docs/ftctl.md).
//   ftctl submit [SPEC.json | --default] [--set field=value]... [--name N] [--priority P] [--wait]
//   ftctl list [--state S]... [--owner O] [--kind K] [-o table|json]
//   ftctl get ID [-o text|json]      ftctl watch ID [-o text|json]
//   ftctl cancel ID                  ftctl wait ID
//   ftctl profile ID [--trace FILE] [--top N]      ftctl compare A B [--top N]
// The address comes from --addr, then $FTD_ADDR, then the config file ($FTCTL_CONFIG, else
// $XDG_CONFIG_HOME/ftd/ftctl.json or ~/.config/ftd/ftctl.json: {"addr": "host:port", "timeout_s": 30}),
// then 127.0.0.1:7070. Exit codes: 0 ok (or the job SUCCEEDED), 1 the job FAILED, 2 the job was
// CANCELLED, 3 the call failed (ftd refused it or could not be reached), 64 bad usage, 130 watch
// interrupted by Ctrl-C (the job goes on).
#include <pwd.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/job_client.h"
#include "client/render.h"
#include "nlohmann/json.hpp"
#include "worker/spec.h"

namespace {

namespace fs = std::filesystem;
using ftd::client::JobClient;

constexpr int kExitCallFailed = 3;
constexpr int kExitUsage = 64;
constexpr int kExitInterrupted = 130;

int Fail(const absl::Status& st) {
  std::cerr << "ftctl: " << absl::StatusCodeToString(st.code()) << ": " << st.message() << std::endl;
  return kExitCallFailed;
}

int Usage(const std::string& msg) {
  std::cerr << "ftctl: " << msg << std::endl;
  return kExitUsage;
}

std::string ConfigPath() {
  if (const char* p = std::getenv("FTCTL_CONFIG"); p != nullptr && *p != '\0') return p;
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x != nullptr && *x != '\0') return std::string(x) + "/ftd/ftctl.json";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') return std::string(h) + "/.config/ftd/ftctl.json";
  return "";
}

// Reads the config file if there is one; a file that exists but does not parse is an error.
absl::Status LoadConfig(std::string* addr, double* timeout_s) {
  const std::string path = ConfigPath();
  if (path.empty() || !fs::exists(path)) return absl::OkStatus();
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("config file ", path,
                                                   " is not a JSON object such as {\"addr\": \"host:7070\"}"));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "addr" && it->is_string()) {
      *addr = it->get<std::string>();
    } else if (it.key() == "timeout_s" && it->is_number() && it->get<double>() > 0) {
      *timeout_s = it->get<double>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": unknown or invalid key \"", it.key(),
                                                     "\" (known: \"addr\" (string), \"timeout_s\" (number > 0))"));
    }
  }
  return absl::OkStatus();
}

std::string UserName() {
  if (const char* u = std::getenv("USER"); u != nullptr && *u != '\0') return u;
  if (const passwd* pw = getpwuid(getuid()); pw != nullptr) return pw->pw_name;
  return "unknown";
}

std::string NewRequestId() {
  std::random_device rd;
  return absl::StrFormat("ftctl-%08x%08x%08x", rd(), rd(), rd());
}

// Ctrl-C during watch/wait stops watching (not the job): a thread takes SIGINT/SIGTERM (blocked in
// every other thread) and interrupts the stream.
class InterruptWatcher {
 public:
  explicit InterruptWatcher(JobClient* c) : client_(c) {
    thread_ = std::thread([this] {
      int sig = 0;
      sigwait(&Set(), &sig);
      if (sig == SIGUSR2) return;  // our own wake-up at exit
      fired_ = true;
      client_->Interrupt();
    });
  }
  ~InterruptWatcher() {
    pthread_kill(thread_.native_handle(), SIGUSR2);
    thread_.join();
  }
  bool fired() const { return fired_; }
  static sigset_t& Set() {
    static sigset_t s = [] {
      sigset_t x;
      sigemptyset(&x);
      sigaddset(&x, SIGINT);
      sigaddset(&x, SIGTERM);
      sigaddset(&x, SIGUSR2);
      return x;
    }();
    return s;
  }

 private:
  JobClient* client_;
  std::thread thread_;
  std::atomic<bool> fired_{false};
};

// Follows a job to its end. `print`: show each event (text or JSON lines). Returns the exit code.
int Follow(JobClient& client, const std::string& id, bool print, bool json) {
  InterruptWatcher interrupt(&client);
  ftd::v1::JobState final_state = ftd::v1::JOB_STATE_UNSPECIFIED;
  bool reconnecting = false;
  const bool live = isatty(STDOUT_FILENO) != 0;  // not a terminal (a file, a pipe): one line per event
  bool live_line = false;
  auto st = client.Watch(
      id, 0,
      [&](const ftd::v1::JobEvent& e) {
        if (e.has_state()) final_state = e.state().state();
        if (reconnecting) {
          std::cerr << "ftctl: reconnected" << std::endl;
          reconnecting = false;
        }
        if (!print) return;
        if (json) {
          std::cout << ftd::client::ToJson(e, false) << std::endl;
        } else if (live && e.has_step()) {
          // On a terminal the step line is one live line, rewritten in place.
          std::cout << "\r\x1b[K" << ftd::client::EventLine(e) << std::flush;
          live_line = true;
        } else {
          if (live_line) std::cout << "\n";
          live_line = false;
          std::cout << ftd::client::EventLine(e) << std::endl;
        }
      },
      [&](const std::string& why) {
        if (!reconnecting) std::cerr << "ftctl: lost the connection to ftd (" << why << "); reconnecting" << std::endl;
        reconnecting = true;
      });
  if (live_line) std::cout << std::endl;
  if (interrupt.fired()) {
    std::cerr << "ftctl: stopped watching " << id << "; the job goes on" << std::endl;
    return kExitInterrupted;
  }
  if (!st.ok()) return Fail(st);
  if (final_state == ftd::v1::JOB_STATE_UNSPECIFIED) {
    auto job = client.Get(id);
    if (!job.ok()) return Fail(job.status());
    final_state = job->state();
  }
  return ftd::client::ExitCodeForState(final_state);
}

absl::StatusOr<ftd::v1::TrainSpec> ReadSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read spec file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto spec = ftd::worker::ParseTrainSpecJson(ss.str());
  if (!spec.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", spec.status().message()));
  return spec;
}

}  // namespace

int main(int argc, char** argv) {
  // Block the signals the interrupt thread waits for before gRPC starts any thread.
  pthread_sigmask(SIG_BLOCK, &InterruptWatcher::Set(), nullptr);

  CLI::App app{"ftctl: submit, list, watch and cancel ftd fine-tuning jobs"};
  app.require_subcommand(1);
  app.fallthrough();  // --addr/--timeout also after the command
  std::string addr_flag;
  double timeout_flag = 0;
  app.add_option("--addr", addr_flag, "ftd address host:port (default: $FTD_ADDR, the config file, 127.0.0.1:7070)");
  app.add_option("--timeout", timeout_flag, "seconds each call may take, retries included (default 30)")
      ->check(CLI::PositiveNumber);

  // submit
  auto* submit = app.add_subcommand("submit", "Submit a job; prints its id");
  std::string spec_path, name, request_id, owner, kind = "finetune";
  bool use_default = false, wait = false;
  std::vector<std::string> sets;
  int priority = 0, max_attempts = 0;
  submit->add_option("spec", spec_path, "TrainSpec JSON file (docs/job-spec.md)");
  submit->add_flag("--default", use_default, "the embedded default job (tiny LLaMA on the arithmetic dataset)");
  submit->add_option("--set", sets, "override a spec field: --set steps=20 --set optimizer.lr=1e-4");
  submit->add_option("--name", name, "a name for the job");
  submit->add_option("--kind", kind, "finetune or profile")->check(CLI::IsMember({"finetune", "profile"}));
  submit->add_option("--priority", priority, "higher runs first, in [-1000, 1000] (default 0)");
  submit->add_option("--request-id", request_id, "idempotency key: a repeated submit returns the same job");
  submit->add_option("--owner", owner, "owner (default: $USER)");
  submit->add_option("--max-attempts", max_attempts, "attempts for infrastructure failures (default: ftd's)");
  submit->add_flag("--wait", wait, "wait for the job to end; exit 0 succeeded, 1 failed, 2 cancelled");

  // list
  auto* list = app.add_subcommand("list", "List jobs, oldest first");
  std::vector<std::string> states;
  std::string list_owner, list_kind, output = "table";
  int limit = 0;
  list->add_option("--state", states, "only these states (repeatable): queued, running, succeeded, failed, cancelled");
  list->add_option("--owner", list_owner, "only this owner's jobs");
  list->add_option("--kind", list_kind, "finetune or profile")->check(CLI::IsMember({"finetune", "profile"}));
  list->add_option("--limit", limit, "at most this many jobs (default: all)")->check(CLI::NonNegativeNumber);
  list->add_option("-o,--output", output, "table or json")->check(CLI::IsMember({"table", "json"}));

  std::string id;
  auto* get = app.add_subcommand("get", "Show one job");
  std::string get_output = "text";
  get->add_option("id", id, "job id")->required();
  get->add_option("-o,--output", get_output, "text or json")->check(CLI::IsMember({"text", "json"}));

  auto* watch = app.add_subcommand("watch", "Follow a job's events live until it ends (Ctrl-C stops watching, not the job)");
  std::string watch_output = "text";
  watch->add_option("id", id, "job id")->required();
  watch->add_option("-o,--output", watch_output, "text (one line per event) or json (one object per event)")
      ->check(CLI::IsMember({"text", "json"}));

  auto* cancel = app.add_subcommand("cancel", "Cancel a queued or running job");
  cancel->add_option("id", id, "job id")->required();

  auto* waitc = app.add_subcommand("wait", "Wait for a job to end; exit 0 succeeded, 1 failed, 2 cancelled");
  waitc->add_option("id", id, "job id")->required();

  auto* profile = app.add_subcommand("profile", "Show a PROFILE job's per-op table; --trace downloads its trace");
  std::string trace_path, profile_output = "text";
  int top = 25;
  profile->add_option("id", id, "job id")->required();
  profile->add_option("--trace", trace_path, "write the Chrome/Perfetto trace JSON to this file");
  profile->add_option("--top", top, "rows of the table (0: all)")->check(CLI::NonNegativeNumber);
  profile->add_option("-o,--output", profile_output, "text or json")->check(CLI::IsMember({"text", "json"}));

  auto* compare = app.add_subcommand("compare", "Two PROFILE jobs side by side per op (time, calls, difference)");
  std::string id_b;
  compare->add_option("a", id, "job id A (e.g. the eager run)")->required();
  compare->add_option("b", id_b, "job id B (e.g. the fused run)")->required();
  compare->add_option("--top", top, "rows (0: all)")->check(CLI::NonNegativeNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }

  std::string addr = "127.0.0.1:7070";
  double timeout_s = 30;
  if (auto st = LoadConfig(&addr, &timeout_s); !st.ok()) return Usage(std::string(st.message()));
  if (const char* env = std::getenv("FTD_ADDR"); env != nullptr && *env != '\0') addr = env;
  if (!addr_flag.empty()) addr = addr_flag;
  if (timeout_flag > 0) timeout_s = timeout_flag;
  ftd::client::ClientOptions opts;
  opts.address = addr;
  opts.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  JobClient client(opts);

  if (*submit) {
    if (spec_path.empty() == !use_default) return Usage("submit takes a spec file or --default (one of them)");
    ftd::v1::SubmitJobRequest req;
    if (use_default) {
      *req.mutable_spec() = ftd::worker::DefaultTrainSpec(/*gpu=*/false);
    } else {
      auto spec = ReadSpec(spec_path);
      if (!spec.ok()) return Usage(std::string(spec.status().message()));
      *req.mutable_spec() = *spec;
    }
    for (const auto& kv : sets) {
      if (auto st = ftd::worker::ApplySetOverride(kv, req.mutable_spec()); !st.ok()) return Usage(std::string(st.message()));
    }
    req.set_kind(kind == "profile" ? ftd::v1::PROFILE : ftd::v1::FINETUNE);
    req.set_name(name);
    req.set_priority(priority);
    req.set_max_attempts(max_attempts);
    req.set_owner(owner.empty() ? UserName() : owner);
    // Always idempotent: a submit retried after a lost answer cannot create a second job.
    req.set_request_id(request_id.empty() ? NewRequestId() : request_id);
    auto resp = client.Submit(req);
    if (!resp.ok()) return Fail(resp.status());
    std::cout << resp->job().id() << std::endl;
    if (!resp->created()) std::cerr << "ftctl: request id already used: this is the existing job" << std::endl;
    if (!wait) return 0;
    const int rc = Follow(client, resp->job().id(), /*print=*/false, false);
    if (rc <= 2) {
      auto job = client.Get(resp->job().id());
      if (job.ok()) std::cerr << job->id() << " " << ftd::v1::JobState_Name(job->state()) << ": " << job->message() << std::endl;
    }
    return rc;
  }
  if (*list) {
    ftd::v1::ListJobsRequest req;
    for (const auto& s : states) {
      ftd::v1::JobState v;
      std::string upper;
      for (char c : s) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      if (!ftd::v1::JobState_Parse(upper, &v) || v == ftd::v1::JOB_STATE_UNSPECIFIED) {
        return Usage(absl::StrCat("--state ", s, " is not a state (queued, running, succeeded, failed, cancelled)"));
      }
      req.add_states(v);
    }
    req.set_owner(list_owner);
    if (!list_kind.empty()) req.set_kind(list_kind == "profile" ? ftd::v1::PROFILE : ftd::v1::FINETUNE);
    std::vector<ftd::v1::Job> jobs;
    do {
      req.set_page_size(limit > 0 ? std::min(500, limit - static_cast<int>(jobs.size())) : 500);
      auto resp = client.List(req);
      if (!resp.ok()) return Fail(resp.status());
      for (const auto& j : resp->jobs()) jobs.push_back(j);
      req.set_page_token(resp->next_page_token());
    } while (!req.page_token().empty() && (limit == 0 || static_cast<int>(jobs.size()) < limit));
    if (output == "json") {
      std::cout << "[";
      for (size_t i = 0; i < jobs.size(); ++i) std::cout << (i ? ",\n" : "\n") << ftd::client::ToJson(jobs[i], false);
      std::cout << (jobs.empty() ? "]" : "\n]") << std::endl;
    } else {
      std::cout << ftd::client::JobsTable(jobs);
    }
    return 0;
  }
  if (*get) {
    auto job = client.Get(id);
    if (!job.ok()) return Fail(job.status());
    std::cout << (get_output == "json" ? ftd::client::ToJson(*job, true) + "\n" : ftd::client::JobText(*job));
    return 0;
  }
  if (*watch) return Follow(client, id, /*print=*/true, watch_output == "json");
  if (*cancel) {
    auto job = client.Cancel(id);
    if (!job.ok()) return Fail(job.status());
    std::cout << job->id() << " " << ftd::v1::JobState_Name(job->state()) << " " << job->reason() << ": "
              << job->message() << std::endl;
    return 0;
  }
  // A profile is ready once the job has one; a job still running has none yet.
  auto profile_of = [&](const std::string& job_id) -> absl::StatusOr<ftd::v1::ProfileReport> {
    auto job = client.Get(job_id);
    if (!job.ok()) return job.status();
    if (job->kind() != ftd::v1::PROFILE) {
      return absl::FailedPreconditionError(absl::StrCat(job_id, " is not a PROFILE job (submit with --kind profile)"));
    }
    if (!job->has_profile()) {
      return absl::FailedPreconditionError(absl::StrCat(job_id, " has no profile yet (", ftd::v1::JobState_Name(job->state()),
                                                        " ", job->reason(), "); ftctl wait ", job_id, " first"));
    }
    return job->profile();
  };
  if (*profile) {
    auto p = profile_of(id);
    if (!p.ok()) return Fail(p.status());
    if (!trace_path.empty()) {
      std::ofstream out(trace_path, std::ios::binary | std::ios::trunc);
      if (!out) return Usage(absl::StrCat("cannot write --trace ", trace_path));
      int64_t bytes = 0;
      if (auto st = client.DownloadTrace(id, out, &bytes); !st.ok()) return Fail(st);
      std::cerr << "ftctl: wrote " << bytes << " bytes of trace to " << trace_path
                << " (open it in https://ui.perfetto.dev or chrome://tracing)" << std::endl;
    }
    std::cout << (profile_output == "json" ? ftd::client::ToJson(*p, true) + "\n" : ftd::worker::ProfileTable(*p, top));
    return 0;
  }
  if (*compare) {
    auto a = profile_of(id);
    if (!a.ok()) return Fail(a.status());
    auto b = profile_of(id_b);
    if (!b.ok()) return Fail(b.status());
    std::cout << ftd::client::CompareTable(id, *a, id_b, *b, top);
    return 0;
  }
  if (*waitc) {
    const int rc = Follow(client, id, /*print=*/false, false);
    if (rc <= 2) {
      auto job = client.Get(id);
      if (job.ok()) std::cout << job->id() << " " << ftd::v1::JobState_Name(job->state()) << ": " << job->message() << std::endl;
    }
    return rc;
  }
  return Usage("no command (ftctl --help lists them)");
}

// Fuzz target over what a client sends to SubmitJob, through the path ftd's handler takes: the
// request's wire bytes parsed (a parse failure answered by RequestParseError, as every method's is),
// or a spec's JSON parsed as ftctl and `ftd-worker run` parse it, then JobManager::Submit on a real
// SQLite store: string bounds, unknown fields and enums, non-finite numbers, the spec's validation,
// its input files and the memory bound, the insert. The property: every input gets an answer, and
// that answer is never UNKNOWN or INTERNAL (an INTERNAL would mean ftd failed on a client's input,
// not that the input was wrong). A violation aborts, so libFuzzer and the driver report it.
//
// The first byte picks how the rest is read: even, SubmitJobRequest wire bytes; odd, a TrainSpec's
// JSON. The entry point is libFuzzer's; CI links it with fuzz_driver.cc, a mutation driver
// (tests/CMakeLists.txt).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "ftd/v1/jobs.pb.h"
#include "google/protobuf/stubs/logging.h"
#include "server/common/clock.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/metrics.h"
#include "server/api/parsed_service.h"
#include "server/store/store.h"
#include "server/executors/executor.h"
#include "spec/spec.h"

namespace {

using ftd::server::Executor;

// Jobs stay queued: the scheduler is never started, so nothing is launched.
class NoWorkers final : public Executor {
 public:
  void SetExitHandler(ExitHandler) override {}
  absl::StatusOr<int64_t> Launch(const ftd::server::LaunchRequest&) override {
    return absl::UnavailableError("the fuzz target starts no worker");
  }
  void Stop(int64_t, std::chrono::milliseconds, ftd::server::StopMode) override {}
  void Postpone(int64_t, std::chrono::milliseconds) override {}
  void Kill(int64_t) override {}
  void KillOrphan(int64_t, const std::string&) override {}
};

struct Daemon {
  Daemon() {
    const char* shm = "/dev/shm";
    std::string tmpl = std::string(::access(shm, W_OK) == 0 ? shm : "/tmp") + "/ftd-fuzz-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    dir = tmpl;
    auto s = ftd::server::Store::Open(dir + "/ftd.db");
    if (!s.ok()) {
      std::fprintf(stderr, "fuzz: %s\n", std::string(s.status().message()).c_str());
      std::abort();
    }
    store = std::move(*s);
    ftd::server::ManagerConfig cfg;
    cfg.data_dir = dir;
    cfg.gpus = 0;
    cfg.max_queued = 64;  // a few real inserts; later valid inputs meet the queue limit after validation
    cfg.memory = {int64_t{16} << 30, 0};
    manager = std::make_unique<ftd::server::JobManager>(cfg, store.get(), &metrics, &launcher, &clock);
    if (!manager->Recover().ok()) std::abort();
  }
  ~Daemon() {
    manager.reset();
    store.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string dir;
  ftd::server::RealClock clock;
  ftd::server::Metrics metrics;
  NoWorkers launcher;
  std::unique_ptr<ftd::server::Store> store;
  std::unique_ptr<ftd::server::JobManager> manager;
};

// How many inputs got which answer at which stage, printed at exit: shows how deep the inputs went.
std::map<std::string, long>& Answers() {
  static auto* m = new std::map<std::string, long>();
  return *m;
}

Daemon& TheDaemon() {
  static auto* d = [] {
    google::protobuf::SetLogHandler(nullptr);  // its log line per invalid UTF-8 string is the answer's job
    std::atexit([] {
      std::fprintf(stderr, "fuzz: answers by stage:");
      for (const auto& [k, n] : Answers()) std::fprintf(stderr, " %s %ld,", k.c_str(), n);
      std::fprintf(stderr, "\n");
    });
    return new Daemon();  // never destroyed: libFuzzer exits without unwinding
  }();
  return *d;
}

void Check(const absl::Status& st, const char* stage) {
  ++Answers()[std::string(stage) + "=" + std::string(absl::StatusCodeToString(st.code()))];
  if (st.code() != absl::StatusCode::kUnknown && st.code() != absl::StatusCode::kInternal) return;
  std::fprintf(stderr, "fuzz: %s answered %s: %s\n", stage, std::string(absl::StatusCodeToString(st.code())).c_str(),
               std::string(st.message()).c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Daemon& d = TheDaemon();
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  ftd::v1::SubmitJobRequest req;
  if (data[0] % 2 == 0) {
    if (!req.ParseFromString(body)) {
      const absl::Status st = ftd::server::RequestParseError(req.GetDescriptor(), body);
      ++Answers()[std::string("parse=") + std::string(absl::StatusCodeToString(st.code()))];
      if (st.code() != absl::StatusCode::kInvalidArgument) std::abort();
      return 0;
    }
  } else {
    auto spec = ftd::spec::ParseTrainSpecJson(body);
    Check(spec.status(), "ParseTrainSpecJson");
    if (!spec.ok()) return 0;
    *req.mutable_spec() = std::move(*spec);
  }
  Check(d.manager->Submit(req, "fuzz").status(), "Submit");
  return 0;
}

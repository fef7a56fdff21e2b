// JobManager's state machine with an injected launcher and clock: no processes, no sleeps, a real
// SQLite store in a temporary directory. The worker is played by calling the worker protocol
// (Assign, OnWorkerMessage) and the launcher's exit handler by hand. Expected reasons and states are
// those docs/api.md promises.
#include "server/jobs/job_manager.h"

#include <gtest/gtest.h>

#include <limits>
#include <signal.h>
#include <stdlib.h>

#include <cctype>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "server/testing/fake_clock.h"
#include "server/testing/full_disk.h"
#include "server/requests/request_limits.h"

namespace ftd::server {
namespace {

namespace fs = std::filesystem;
using ftd::v1::Job;
using ftd::v1::JobEvent;
using ftd::v1::RunResult;

using testing::FakeClock;

// Starts nothing: records what it was asked, hands out made-up pids, and lets the test end workers.
class FakeLauncher final : public Executor {
 public:
  void SetExitHandler(ExitHandler h) override {
    std::lock_guard<std::mutex> l(mu);
    handler = std::move(h);
  }
  absl::StatusOr<int64_t> Launch(const LaunchRequest& req) override {
    if (on_launch) on_launch(req);
    std::lock_guard<std::mutex> l(mu);
    if (!fail_next.ok()) {
      auto st = fail_next;
      fail_next = absl::OkStatus();
      return st;
    }
    launches.push_back(req);
    pids.push_back(next_pid);
    return next_pid++;
  }
  void Stop(int64_t pid, std::chrono::milliseconds grace, StopMode mode) override {
    std::lock_guard<std::mutex> l(mu);
    stops.emplace_back(pid, grace.count());
    stop_modes.push_back(mode);
    cv.notify_all();
  }
  void Postpone(int64_t pid, std::chrono::milliseconds grace) override {
    std::lock_guard<std::mutex> l(mu);
    postponed.emplace_back(pid, grace.count());
  }
  void Kill(int64_t pid) override {
    std::lock_guard<std::mutex> l(mu);
    kills.push_back(pid);
  }
  void KillOrphan(int64_t pid, const std::string& job_id) override {
    std::lock_guard<std::mutex> l(mu);
    orphans.emplace_back(pid, job_id);
  }
  // The worker of `req` is gone.
  void Exit(const LaunchRequest& req, ExitStatus st) {
    ExitHandler h;
    {
      std::lock_guard<std::mutex> l(mu);
      h = handler;
    }
    h(req.job_id, req.attempt, st);
  }
  LaunchRequest Last() {
    std::lock_guard<std::mutex> l(mu);
    return launches.back();
  }
  size_t Launches() {
    std::lock_guard<std::mutex> l(mu);
    return launches.size();
  }

  std::mutex mu;
  std::condition_variable cv;
  ExitHandler handler;
  std::function<void(const LaunchRequest&)> on_launch;
  absl::Status fail_next = absl::OkStatus();
  std::vector<LaunchRequest> launches;
  std::vector<int64_t> pids;
  std::vector<std::pair<int64_t, int64_t>> stops;  // (pid, grace ms)
  std::vector<StopMode> stop_modes;
  std::vector<std::pair<int64_t, int64_t>> postponed;  // (pid, grace ms)
  std::vector<int64_t> kills;
  std::vector<std::pair<int64_t, std::string>> orphans;
  int64_t next_pid = 4242;
};

ExitStatus Exited(int code) { return ExitStatus{false, code, 0}; }
ExitStatus Signaled(int sig) { return ExitStatus{true, 0, sig}; }

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ftd-job-manager-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    OpenStore();
    cfg_.data_dir = dir_;
    cfg_.gpus = 0;
    cfg_.default_max_attempts = 3;
    cfg_.grace_ms = 3000;
    cfg_.heartbeat_timeout_ms = 5000;
    cfg_.backoff_base_ms = 1000;
    cfg_.backoff_max_ms = 60000;
  }
  void TearDown() override {
    manager_.reset();
    store_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  void OpenStore() {
    auto s = Store::Open((fs::path(dir_) / "ftd.db").string());
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  // A manager over the store, recovered as at daemon start; the scheduling thread is not started.
  JobManager& Make() {
    manager_.reset();
    launcher_ = std::make_unique<FakeLauncher>();
    metrics_ = std::make_unique<Metrics>();
    manager_ = std::make_unique<JobManager>(cfg_, store_.get(), metrics_.get(), launcher_.get(), &clock_);
    auto st = manager_->Recover();
    EXPECT_TRUE(st.ok()) << st;
    return *manager_;
  }

  std::string Submit(const std::string& name, int priority = 0, int max_attempts = 0) {
    ftd::v1::SubmitJobRequest req;
    req.set_name(name);
    req.set_priority(priority);
    if (max_attempts != 0) req.set_max_attempts(max_attempts);  // 0: unset, the default
    auto* spec = req.mutable_spec();
    spec->mutable_model()->set_preset("tiny");
    spec->set_batch_size(4);
    spec->set_seq_len(32);
    spec->set_device("cpu");
    spec->set_steps(10);
    auto r = manager_->Submit(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->job().id() : "";
  }
  Job Get(const std::string& id) {
    auto j = manager_->Get(id);
    EXPECT_TRUE(j.ok()) << j.status();
    return j.ok() ? *j : Job();
  }
  std::vector<JobEvent> EventLog(const std::string& id) {
    auto e = store_->Events(id, 0, kMaxEventsPerRead);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? *e : std::vector<JobEvent>();
  }
  // The job as its last state event recorded it (Get() words a waiting job's reason anew).
  Job LastState(const std::string& id) {
    Job last;
    for (const auto& e : EventLog(id)) {
      if (e.has_state()) last = e.state();
    }
    return last;
  }
  // The worker's side of the protocol.
  static ftd::v1::WorkerHello Hello(const LaunchRequest& l) {
    ftd::v1::WorkerHello h;
    h.set_job_id(l.job_id);
    h.set_attempt(l.attempt);
    h.set_token(l.token);
    return h;
  }
  absl::StatusOr<bool> Send(const LaunchRequest& l, ftd::v1::WorkerMessage m) {
    *m.mutable_hello() = Hello(l);
    return manager_->OnWorkerMessage(m);
  }
  absl::StatusOr<bool> Step(const LaunchRequest& l, int64_t step) {
    ftd::v1::WorkerMessage m;
    m.mutable_step()->set_step(step);
    m.mutable_step()->set_tokens_total(step * 128);
    return Send(l, m);
  }
  absl::StatusOr<bool> Report(const LaunchRequest& l, RunResult::Outcome outcome, const std::string& message) {
    ftd::v1::WorkerMessage m;
    m.mutable_result()->set_outcome(outcome);
    m.mutable_result()->set_message(message);
    return Send(l, m);
  }
  // Starts the queued job the policy picks; returns its launch.
  LaunchRequest StartNext() {
    const size_t before = launcher_->Launches();
    manager_->Tick();
    EXPECT_EQ(launcher_->Launches(), before + 1) << "Tick() started no job";
    LaunchRequest l = launcher_->Last();
    EXPECT_TRUE(manager_->Assign(Hello(l)).ok());
    return l;
  }
  double Counter(const std::string& family, const std::map<std::string, std::string>& labels) {
    for (const auto& f : metrics_->registry()->Collect()) {
      if (f.name != family) continue;
      for (const auto& m : f.metric) {
        std::map<std::string, std::string> got;
        for (const auto& lp : m.label) got[lp.name] = lp.value;
        if (got == labels) return f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
      }
    }
    ADD_FAILURE() << "no series " << family;
    return -1;
  }

  std::string dir_;
  ManagerConfig cfg_;
  FakeClock clock_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<FakeLauncher> launcher_;
  std::unique_ptr<JobManager> manager_;
};

// The last two events of a job that ended: its final state, then its result.
void ExpectEndedLog(const std::vector<JobEvent>& log, ftd::v1::JobState state) {
  ASSERT_GE(log.size(), 2u);
  const JobEvent& s = log[log.size() - 2];
  const JobEvent& r = log.back();
  ASSERT_TRUE(s.has_state());
  EXPECT_EQ(s.state().state(), state);
  ASSERT_TRUE(r.has_result());
  EXPECT_EQ(r.result().outcome(), s.state().result().outcome());
  for (size_t i = 0; i + 2 < log.size(); ++i) EXPECT_FALSE(log[i].has_result()) << "a result before the end";
}

TEST_F(JobManagerTest, QueuedRunningSucceeded) {
  auto& m = Make();
  const std::string id = Submit("ok");
  Job j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::QUEUED);
  EXPECT_EQ(j.queue_position(), 1);
  EXPECT_EQ(j.reason(), "WAITING_FOR_SLOT");
  EXPECT_EQ(launcher_->Launches(), 0u);  // nothing starts until the scheduler runs

  clock_.Advance(7);
  m.Tick();
  ASSERT_EQ(launcher_->Launches(), 1u);
  const LaunchRequest l = launcher_->Last();
  EXPECT_EQ(l.job_id, id);
  EXPECT_EQ(l.attempt, 1);
  EXPECT_EQ(l.slot, "cpu");
  EXPECT_GE(l.token.size(), 32u);
  j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::RUNNING);
  EXPECT_EQ(j.worker_pid(), launcher_->pids.back());
  EXPECT_EQ(j.started_unix_ms(), clock_.unix_ms);
  EXPECT_EQ(j.queue_position(), 0);

  auto a = m.Assign(Hello(l));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->name(), "ok");
  EXPECT_EQ(a->checkpoint_dir(), (fs::path(dir_) / "jobs" / id / "checkpoints").string());
  ASSERT_TRUE(Step(l, 1).ok());
  EXPECT_EQ(Get(id).last_step().step(), 1);
  ASSERT_TRUE(Report(l, RunResult::SUCCEEDED, "10 steps").ok());
  clock_.Advance(1000);
  launcher_->Exit(l, Exited(0));

  j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::SUCCEEDED);
  EXPECT_EQ(j.reason(), "SUCCEEDED");
  EXPECT_EQ(j.message(), "10 steps");
  EXPECT_EQ(j.result().outcome(), RunResult::SUCCEEDED);
  EXPECT_EQ(j.worker_pid(), 0);
  EXPECT_EQ(j.finished_unix_ms(), clock_.unix_ms);
  ExpectEndedLog(EventLog(id), ftd::v1::SUCCEEDED);
  EXPECT_EQ(Counter("ftd_job_completions_total", {{"state", "succeeded"}, {"outcome", "succeeded"}}), 1);
  EXPECT_EQ(Counter("ftd_worker_steps_total", {{"slot", "cpu"}, {"kernel_set", "eager"}}), 1);
  // The attempt is over: its token opens nothing any more, and the slot is free.
  EXPECT_EQ(Step(l, 2).status().code(), absl::StatusCode::kPermissionDenied);
  Submit("next");
  m.Tick();
  EXPECT_EQ(launcher_->Launches(), 2u);
}

struct Outcome {
  const char* name;
  bool report;
  RunResult::Outcome reported;
  ExitStatus exit;
  ftd::v1::JobState state;  // with max_attempts 1
  const char* reason;
  const char* in_message;
  bool infrastructure;      // retried when attempts are left (docs/api.md)
};

void PrintTo(const Outcome& o, std::ostream* os) { *os << o.name; }

class OutcomeTest : public JobManagerTest, public ::testing::WithParamInterface<Outcome> {};

TEST_P(OutcomeTest, EachEndingIsClassifiedAndRetriedOnlyIfInfrastructure) {
  const Outcome& o = GetParam();
  for (int max_attempts : {1, 3}) {
    SCOPED_TRACE(max_attempts);
    Make();
    const std::string id = Submit(o.name, 0, max_attempts);
    const LaunchRequest l = StartNext();
    if (o.report) {
      ASSERT_TRUE(Report(l, o.reported, "the worker's words").ok());
    }
    launcher_->Exit(l, o.exit);
    const Job j = Get(id);
    EXPECT_EQ(j.reason(), o.reason);
    EXPECT_NE(j.message().find(o.in_message), std::string::npos) << j.message();
    if (o.infrastructure && max_attempts > 1) {
      EXPECT_EQ(j.state(), ftd::v1::QUEUED);
      EXPECT_NE(j.message().find("attempt 1 of 3 failed"), std::string::npos) << j.message();
      EXPECT_EQ(Counter("ftd_job_retries_total", {{"reason", absl::AsciiStrToLower(o.reason)}}), 1);
    } else {
      EXPECT_EQ(j.state(), o.state);
      EXPECT_EQ(j.attempt(), 1);
      ExpectEndedLog(EventLog(id), o.state);
      if (o.infrastructure) {
        EXPECT_NE(j.message().find("no retries left"), std::string::npos) << j.message();
      }
      // The worker's result where it decided the outcome; FAILED where the daemon saw the failure.
      EXPECT_EQ(j.result().outcome(), o.infrastructure ? RunResult::FAILED : o.reported);
      EXPECT_EQ(Counter("ftd_job_completions_total",
                        {{"state", StateLabel(o.state)}, {"outcome", absl::AsciiStrToLower(o.reason)}}),
                1);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Outcomes, OutcomeTest,
    ::testing::Values(
        Outcome{"oom", true, RunResult::OUT_OF_MEMORY, Exited(3), ftd::v1::FAILED, "GPU_OUT_OF_MEMORY",
                "the worker's words", false},
        Outcome{"invalid", true, RunResult::INVALID_SPEC, Exited(2), ftd::v1::FAILED, "INVALID_SPEC",
                "the worker's words", false},
        Outcome{"nonfinite", true, RunResult::NON_FINITE, Exited(4), ftd::v1::FAILED, "NON_FINITE",
                "the worker's words", false},
        Outcome{"error", true, RunResult::FAILED, Exited(1), ftd::v1::FAILED, "WORKER_ERROR", "exit code 1", false},
        Outcome{"sigkill", false, RunResult::OUTCOME_UNSPECIFIED, Signaled(SIGKILL), ftd::v1::FAILED,
                "KILLED_BY_SIGNAL", "SIGKILL", true},
        Outcome{"segv-after-success", true, RunResult::SUCCEEDED, Signaled(SIGSEGV), ftd::v1::FAILED,
                "KILLED_BY_SIGNAL", "SIGSEGV", true},
        Outcome{"exit", false, RunResult::OUTCOME_UNSPECIFIED, Exited(5), ftd::v1::FAILED, "WORKER_EXIT",
                "exit code 5 before reporting a result", true}),
    [](const auto& info) {
      std::string n = info.param.name;
      for (auto& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return n;
    });

TEST_F(JobManagerTest, SpawnFailureIsAnInfrastructureFailure) {
  auto& m = Make();
  const std::string id = Submit("nospawn", 0, 2);
  launcher_->fail_next = absl::InternalError("cannot start /nonexistent/ftd-worker: No such file or directory");
  m.Tick();
  Job j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::QUEUED);
  EXPECT_EQ(j.reason(), "SPAWN_FAILED");
  EXPECT_NE(j.message().find("/nonexistent/ftd-worker"), std::string::npos) << j.message();
  clock_.Advance(1000);
  launcher_->fail_next = absl::InternalError("cannot start /nonexistent/ftd-worker: No such file or directory");
  m.Tick();
  j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::FAILED);
  EXPECT_EQ(j.attempt(), 2);
  EXPECT_NE(j.message().find("no retries left"), std::string::npos) << j.message();
}

// ftd out of descriptors (the flood): the launch fails with RESOURCE_EXHAUSTED. That is not
// the job's attempt: however often it happens, the job stays queued with its attempts intact and
// waits longer each time before it is tried again.
TEST_F(JobManagerTest, ALaunchTheDaemonIsTooShortForIsRetriedWithBackoffAndNotCounted) {
  auto& m = Make();
  const std::string id = Submit("short", 0, 1);  // one attempt only: a counted failure would end it
  int64_t wait_ms = cfg_.backoff_base_ms;
  for (int i = 1; i <= 3; ++i) {
    launcher_->fail_next = absl::ResourceExhaustedError("cannot start ftd-worker: pipe: Too many open files");
    m.Tick();
    Job j = Get(id);
    ASSERT_EQ(j.state(), ftd::v1::QUEUED) << i << ": " << j.message();
    EXPECT_EQ(j.reason(), "DAEMON_SHORT_OF_RESOURCES");
    EXPECT_EQ(j.attempt(), 0) << "not counted";
    EXPECT_NE(j.message().find("pipe: Too many open files"), std::string::npos) << j.message();
    EXPECT_NE(j.message().find(absl::StrCat("(", i, " in a row)")), std::string::npos) << j.message();
    EXPECT_EQ(j.not_before_unix_ms(), clock_.UnixMs() + wait_ms);
    clock_.Advance(wait_ms - 1);
    m.Tick();
    EXPECT_EQ(launcher_->Launches(), 0u) << "not before its backoff";
    clock_.Advance(1);
    wait_ms *= 2;
  }
  const LaunchRequest l = StartNext();
  EXPECT_EQ(l.attempt, 1);
  Job j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::RUNNING);
  EXPECT_EQ(j.attempt(), 1);
}

TEST_F(JobManagerTest, ASilentWorkerIsKilledAndItsJobRetried) {
  auto& m = Make();
  const std::string id = Submit("silent", 0, 2);
  const LaunchRequest l = StartNext();
  ASSERT_TRUE(Step(l, 1).ok());
  // The scheduler asks to run again when the heartbeat would expire.
  auto wait = m.Tick();
  ASSERT_TRUE(wait.has_value());
  EXPECT_EQ(wait->count(), cfg_.heartbeat_timeout_ms);
  clock_.Advance(cfg_.heartbeat_timeout_ms - 1);
  m.Tick();
  EXPECT_TRUE(launcher_->kills.empty());
  clock_.Advance(1);
  m.Tick();
  ASSERT_EQ(launcher_->kills.size(), 1u);
  EXPECT_EQ(launcher_->kills[0], launcher_->pids[0]);
  launcher_->Exit(l, Signaled(SIGKILL));
  const Job j = Get(id);
  EXPECT_EQ(j.reason(), "LOST_HEARTBEAT");  // not KILLED_BY_SIGNAL: the daemon sent that signal
  EXPECT_EQ(j.state(), ftd::v1::QUEUED);
}

// The store and the data directory on a 4 MiB tmpfs (`disk`), to fill.
class FullDiskTest : public JobManagerTest {
 protected:
  void SetUp() override {
    JobManagerTest::SetUp();
    disk = fs::path(dir_) / "disk";
    fs::create_directories(disk);
    if (const std::string why = testing::MountSmallTmpfs(disk, "4m"); !why.empty()) GTEST_SKIP() << why;
    unmount.dir = disk;
    auto s = Store::Open((disk / "ftd.db").string());
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    cfg_.data_dir = disk.string();
  }
  void TearDown() override {
    manager_.reset();
    store_.reset();
    if (!unmount.dir.empty()) ::umount2(disk.c_str(), MNT_DETACH);
    unmount.dir.clear();
    JobManagerTest::TearDown();
  }
  fs::path disk;
  testing::Unmount unmount;
};

// The store on a disk that fills while a job runs: the worker's reports are dropped but it goes on;
// its outcome, which the store refuses, stays in memory (the attempt keeps its slot), is counted
// and exported; a cancel answers and does not change a final outcome; SubmitJob is
// RESOURCE_EXHAUSTED; once there is room the outcome is written and nothing is lost.
TEST_F(FullDiskTest, AnOutcomeTheFullDiskRefusesIsKeptInMemoryAndWrittenOnceThereIsRoom) {
  auto& m = Make();
  const std::string id = Submit("fills-the-disk", 0, 3);
  const LaunchRequest l = StartNext();
  ASSERT_TRUE(Step(l, 1).ok());
  const fs::path filler = testing::FillDisk(disk);

  auto step = Step(l, 2);  // not stored, but the worker is not cut off for it
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_FALSE(*step);
  EXPECT_GE(Counter("ftd_store_write_failures_total", {{"write", "event"}}), 1);
  ASSERT_TRUE(Report(l, RunResult::FAILED, "write step-00000002.tmp: No space left on device").ok());
  launcher_->Exit(l, Exited(1));
  Job j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::RUNNING);  // what the store still says
  EXPECT_EQ(Counter("ftd_unrecorded_outcomes", {}), 1);
  EXPECT_GE(Counter("ftd_store_write_failures_total", {{"write", "state"}}), 1);
  m.Tick();  // tries again, fails again
  EXPECT_EQ(Counter("ftd_unrecorded_outcomes", {}), 1);
  EXPECT_EQ(launcher_->Launches(), 1u);  // the slot stays taken

  auto c = m.Cancel(id);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(c->message().find("WORKER_ERROR"), std::string::npos) << c->message();
  EXPECT_NE(c->message().find("keeps it in memory"), std::string::npos) << c->message();
  ftd::v1::SubmitJobRequest req;
  req.set_name(std::string(200, 'n'));
  req.mutable_spec()->mutable_model()->set_preset("tiny");
  req.mutable_spec()->set_device("cpu");
  absl::Status refused;
  for (int i = 0; i < 50 && refused.ok(); ++i) refused = m.Submit(req).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("the disk is full"), std::string::npos) << refused;
  EXPECT_GE(Counter("ftd_store_write_failures_total", {{"write", "submit"}}), 1);

  fs::remove(filler);
  m.Tick();
  j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::FAILED);  // the worker's own outcome: the cancel came after it
  EXPECT_EQ(j.reason(), "WORKER_ERROR");
  EXPECT_NE(j.message().find("No space left on device"), std::string::npos) << j.message();
  EXPECT_EQ(Counter("ftd_unrecorded_outcomes", {}), 0);
  ExpectEndedLog(EventLog(id), ftd::v1::FAILED);
  EXPECT_EQ(launcher_->Launches(), 1u);
  Submit("after");
  m.Tick();
  EXPECT_EQ(launcher_->Launches(), 2u);  // the slot is free again
}

// An attempt that would be retried, ended while its outcome cannot be written, and cancelled: the
// cancel wins once it is written.
TEST_F(FullDiskTest, ACancelStopsTheRetryOfAnOutcomeWaitingInMemory) {
  auto& m = Make();
  const std::string id = Submit("killed", 0, 3);
  const LaunchRequest l = StartNext();
  const fs::path filler = testing::FillDisk(disk);
  launcher_->Exit(l, Signaled(SIGKILL));
  EXPECT_EQ(Get(id).state(), ftd::v1::RUNNING);
  auto c = m.Cancel(id);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(c->message().find("it will not be retried"), std::string::npos) << c->message();
  fs::remove(filler);
  m.Tick();
  const Job j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::CANCELLED);
  EXPECT_EQ(j.attempt(), 1);
}

// A daemon restarted on a full disk with a job its predecessor left RUNNING: Recover() succeeds
// (ftd starts; before, the refused write failed the start), the job reads RUNNING with its orphan
// killed, the wait is counted and exported, and once there is room Tick() applies the restart
// policy: the job is requeued and starts its next attempt.
TEST_F(FullDiskTest, ARestartOnAFullDiskStartsAndAppliesTheRestartPolicyOnceThereIsRoom) {
  Make();
  const std::string id = Submit("survivor", 0, 3);
  StartNext();
  const int64_t pid = launcher_->pids.back();
  const fs::path filler = testing::FillDisk(disk);
  cfg_.requeue_on_restart = true;
  manager_.reset();
  launcher_ = std::make_unique<FakeLauncher>();
  metrics_ = std::make_unique<Metrics>();
  manager_ = std::make_unique<JobManager>(cfg_, store_.get(), metrics_.get(), launcher_.get(), &clock_);
  ASSERT_TRUE(manager_->Recover().ok());
  auto& m = *manager_;
  ASSERT_EQ(launcher_->orphans.size(), 1u);
  EXPECT_EQ(launcher_->orphans[0], std::make_pair(pid, id));
  EXPECT_EQ(Get(id).state(), ftd::v1::RUNNING);
  EXPECT_EQ(Counter("ftd_unrecorded_outcomes", {}), 1);
  EXPECT_GE(Counter("ftd_store_write_failures_total", {{"write", "state"}}), 1);
  const auto wait = m.Tick();  // still full: asks to try again within a second
  ASSERT_TRUE(wait.has_value());
  EXPECT_LE(wait->count(), 1000);
  EXPECT_EQ(Get(id).state(), ftd::v1::RUNNING);
  EXPECT_EQ(launcher_->Launches(), 0u);

  fs::remove(filler);
  m.Tick();  // writes the restart (requeued), then starts the next attempt in the same round
  bool requeued = false;
  for (const auto& e : EventLog(id)) {
    requeued |= e.has_state() && e.state().state() == ftd::v1::QUEUED && e.state().reason() == "DAEMON_RESTART";
  }
  EXPECT_TRUE(requeued);
  EXPECT_EQ(Counter("ftd_unrecorded_outcomes", {}), 0);
  ASSERT_EQ(launcher_->Launches(), 1u);
  EXPECT_EQ(launcher_->Last().attempt, 2);
  EXPECT_EQ(Get(id).state(), ftd::v1::RUNNING);
}

// Nothing but the clock wakes the scheduler for a worker that goes silent right after its start:
// the round that starts it asks to run again by the heartbeat's deadline.
TEST_F(JobManagerTest, TheRoundThatStartsAWorkerAsksToRunAgainByItsHeartbeatDeadline) {
  auto& m = Make();
  Submit("silent-from-the-start");
  const auto wait = m.Tick();
  ASSERT_EQ(launcher_->Launches(), 1u);
  ASSERT_TRUE(wait.has_value());
  EXPECT_LE(wait->count(), cfg_.heartbeat_timeout_ms);
  clock_.Advance(cfg_.heartbeat_timeout_ms);
  m.Tick();
  EXPECT_EQ(launcher_->kills.size(), 1u);
}

// A training thread blocked (in a read of a FIFO, a hung collective) while the heartbeat thread
// goes on: the progress watchdog sees neither a step nor load/checkpoint progress, stops the worker
// and fails the job as NO_PROGRESS, without a retry. Progress of any kind resets it.
TEST_F(JobManagerTest, AWorkerWithNoProgressIsStoppedAsStuck) {
  cfg_.progress_timeout_ms = 10000;
  auto& m = Make();
  const std::string id = Submit("stuck", 0, 3);
  const LaunchRequest l = StartNext();
  auto beat = [&](ftd::v1::WorkerMessage msg) {
    clock_.Advance(1000);
    ASSERT_TRUE(Send(l, msg).ok());
    m.Tick();
  };
  ftd::v1::WorkerMessage heartbeat, started, loading;
  heartbeat.set_heartbeat(true);
  started.set_started(true);
  loading.mutable_progress()->set_phase("load_data");
  loading.mutable_progress()->set_done_bytes(4096);
  loading.mutable_progress()->set_total_bytes(8192);
  // Until the worker says it started, only the heartbeat timeout applies.
  for (int i = 0; i < 12; ++i) beat(heartbeat);
  EXPECT_TRUE(launcher_->kills.empty());
  beat(started);
  for (int i = 0; i < 8; ++i) beat(heartbeat);
  beat(loading);  // 9 s after the start: moving
  for (int i = 0; i < 9; ++i) beat(heartbeat);
  EXPECT_TRUE(launcher_->kills.empty());
  ASSERT_TRUE(Step(l, 1).ok());  // a step report resets it too
  for (int i = 0; i < 9; ++i) beat(heartbeat);
  EXPECT_TRUE(launcher_->kills.empty());
  // The scheduler asks to run again when the watchdog would fire (1 s from now).
  const auto wait = m.Tick();
  ASSERT_TRUE(wait.has_value());
  EXPECT_EQ(wait->count(), 1000);
  beat(heartbeat);  // 10 s of heartbeats only, since step 1
  ASSERT_EQ(launcher_->kills.size(), 1u);
  EXPECT_EQ(launcher_->kills[0], launcher_->pids[0]);
  EXPECT_EQ(Get(id).state(), ftd::v1::RUNNING);  // until the worker is gone
  launcher_->Exit(l, Signaled(SIGKILL));
  const Job j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::FAILED);
  EXPECT_EQ(j.reason(), "NO_PROGRESS");  // not KILLED_BY_SIGNAL: the daemon sent that signal
  EXPECT_EQ(j.attempt(), 1);             // and not retried: it would hang again
  EXPECT_NE(j.message().find("no step and no load or checkpoint progress for 10 s"), std::string::npos)
      << j.message();
  EXPECT_NE(j.message().find("last: step 1"), std::string::npos) << j.message();
  EXPECT_EQ(Counter("ftd_job_completions_total", {{"state", "failed"}, {"outcome", "no_progress"}}), 1);
}

TEST_F(JobManagerTest, TheWatchdogNamesTheLastPhaseAndCanBeTurnedOff) {
  for (int64_t timeout : {int64_t{0}, int64_t{3000}}) {
    SCOPED_TRACE(timeout);
    cfg_.progress_timeout_ms = timeout;
    auto& m = Make();
    const std::string id = Submit("stuck", 0, 1);
    const LaunchRequest l = StartNext();
    ftd::v1::WorkerMessage loading;
    loading.mutable_progress()->set_step(7);
    loading.mutable_progress()->set_phase("save_checkpoint");
    loading.mutable_progress()->set_done_bytes(100);
    loading.mutable_progress()->set_total_bytes(900);
    ASSERT_TRUE(Send(l, loading).ok());
    ftd::v1::WorkerMessage heartbeat;
    heartbeat.set_heartbeat(true);
    for (int i = 0; i < 4; ++i) {
      clock_.Advance(1000);
      ASSERT_TRUE(Send(l, heartbeat).ok());
      m.Tick();
    }
    if (timeout == 0) {
      EXPECT_TRUE(launcher_->kills.empty());
      continue;
    }
    ASSERT_EQ(launcher_->kills.size(), 1u);
    launcher_->Exit(l, Signaled(SIGKILL));
    EXPECT_NE(Get(id).message().find("last: save_checkpoint 100 of 900 bytes after step 7"), std::string::npos)
        << Get(id).message();
  }
}

TEST_F(JobManagerTest, RetriesWaitForTheirBackoffAndStopAtMaxAttempts) {
  auto& m = Make();
  const std::string id = Submit("flaky", 0, 3);
  LaunchRequest l = StartNext();
  for (int attempt = 1; attempt <= 3; ++attempt) {
    SCOPED_TRACE(attempt);
    EXPECT_EQ(l.attempt, attempt);
    launcher_->Exit(l, Signaled(SIGKILL));
    Job j = Get(id);
    if (attempt == 3) {
      EXPECT_EQ(j.state(), ftd::v1::FAILED);
      EXPECT_NE(j.message().find("attempt 3 of 3; no retries left"), std::string::npos) << j.message();
      break;
    }
    const int64_t backoff = 1000 << (attempt - 1);  // --backoff-s doubling per attempt (docs/api.md)
    EXPECT_EQ(j.state(), ftd::v1::QUEUED);
    EXPECT_EQ(j.not_before_unix_ms(), clock_.unix_ms + backoff);
    EXPECT_NE(j.message().find("retry in"), std::string::npos) << j.message();
    auto wait = m.Tick();
    EXPECT_EQ(launcher_->Launches(), static_cast<size_t>(attempt)) << "started before its backoff";
    ASSERT_TRUE(wait.has_value());
    EXPECT_EQ(wait->count(), backoff);
    clock_.Advance(backoff - 1);
    m.Tick();
    EXPECT_EQ(launcher_->Launches(), static_cast<size_t>(attempt));
    clock_.Advance(1);
    const LaunchRequest old = l;
    l = StartNext();
    EXPECT_NE(l.token, old.token);
    EXPECT_EQ(Step(old, 1).status().code(), absl::StatusCode::kPermissionDenied);  // the old attempt is refused
  }
  EXPECT_EQ(Counter("ftd_job_retries_total", {{"reason", "killed_by_signal"}}), 2);
  EXPECT_EQ(Counter("ftd_job_completions_total", {{"state", "failed"}, {"outcome", "killed_by_signal"}}), 1);
}

TEST_F(JobManagerTest, CancelWhileQueued) {
  auto& m = Make();
  const std::string a = Submit("a"), b = Submit("b");
  auto c = m.Cancel(a);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state(), ftd::v1::CANCELLED);
  EXPECT_EQ(c->reason(), "CANCELLED");
  EXPECT_EQ(c->result().outcome(), RunResult::CANCELLED);
  ExpectEndedLog(EventLog(a), ftd::v1::CANCELLED);
  EXPECT_EQ(Get(b).queue_position(), 1);
  m.Tick();
  ASSERT_EQ(launcher_->Launches(), 1u);
  EXPECT_EQ(launcher_->Last().job_id, b);  // the cancelled job never starts
  auto again = m.Cancel(a);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("already cancelled"), std::string::npos);
}

TEST_F(JobManagerTest, CancelWhileTheWorkerIsBeingLaunched) {
  auto& m = Make();
  const std::string id = Submit("starting");
  absl::StatusOr<Job> during = absl::UnknownError("not called");
  launcher_->on_launch = [&](const LaunchRequest&) { during = m.Cancel(id); };
  m.Tick();
  ASSERT_TRUE(during.ok()) << during.status();  // not "try again": the cancel is taken
  EXPECT_EQ(during->reason(), "CANCELLING");
  // The launch completes and the new worker is told to stop at once.
  ASSERT_EQ(launcher_->stops.size(), 1u);
  EXPECT_EQ(launcher_->stops[0].first, launcher_->pids[0]);
  EXPECT_EQ(launcher_->stops[0].second, cfg_.grace_ms);
  launcher_->Exit(launcher_->Last(), Signaled(SIGTERM));
  const Job j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::CANCELLED);
  EXPECT_EQ(j.reason(), "CANCELLED");
  EXPECT_EQ(j.result().outcome(), RunResult::CANCELLED);
  ExpectEndedLog(EventLog(id), ftd::v1::CANCELLED);
}

TEST_F(JobManagerTest, CancelBeforeTheWorkerSaidHello) {
  auto& m = Make();
  const std::string id = Submit("early");
  m.Tick();
  const LaunchRequest l = launcher_->Last();
  auto c = m.Cancel(id);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(launcher_->stops.size(), 1u);
  // The worker's first call learns it is to stop.
  EXPECT_TRUE(m.Assign(Hello(l)).ok());
  auto ack = Step(l, 1);
  ASSERT_TRUE(ack.ok());
  EXPECT_TRUE(*ack);
  launcher_->Exit(l, Exited(5));
  EXPECT_EQ(Get(id).state(), ftd::v1::CANCELLED);
}

TEST_F(JobManagerTest, CancelWhileRunning) {
  auto& m = Make();
  const std::string id = Submit("running");
  const LaunchRequest l = StartNext();
  auto ack = Step(l, 1);
  ASSERT_TRUE(ack.ok());
  EXPECT_FALSE(*ack);
  auto c = m.Cancel(id);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state(), ftd::v1::RUNNING);
  EXPECT_EQ(c->reason(), "CANCELLING");
  ASSERT_EQ(launcher_->stops.size(), 1u);
  EXPECT_EQ(launcher_->stops[0], std::make_pair(launcher_->pids[0], static_cast<int64_t>(cfg_.grace_ms)));
  ack = Step(l, 2);
  ASSERT_TRUE(ack.ok());
  EXPECT_TRUE(*ack);  // the worker's acks say stop
  ASSERT_TRUE(Report(l, RunResult::CANCELLED, "stopped at step 2").ok());
  launcher_->Exit(l, Exited(5));
  const Job j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::CANCELLED);
  EXPECT_EQ(j.reason(), "CANCELLED");
  EXPECT_EQ(j.result().outcome(), RunResult::CANCELLED);
  EXPECT_NE(j.message().find("exit code 5"), std::string::npos) << j.message();
  ExpectEndedLog(EventLog(id), ftd::v1::CANCELLED);
  EXPECT_EQ(Counter("ftd_job_completions_total", {{"state", "cancelled"}, {"outcome", "cancelled"}}), 1);
}

TEST_F(JobManagerTest, AWorkerThatDiesWhileBeingLaunchedIsClassified) {
  auto& m = Make();
  const std::string id = Submit("dies-at-once", 0, 1);
  launcher_->on_launch = [&](const LaunchRequest& req) {
    launcher_->on_launch = nullptr;
    launcher_->Exit(req, Exited(127));  // reported before Launch returned its pid
  };
  m.Tick();
  Job j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::FAILED);
  EXPECT_EQ(j.reason(), "WORKER_EXIT");
  EXPECT_EQ(j.worker_pid(), 0);
  Submit("after");
  m.Tick();
  EXPECT_EQ(launcher_->Launches(), 2u);  // the slot was freed
}

// A daemon that died with a job RUNNING; a new one starts on the same store.
class RestartTest : public JobManagerTest {
 protected:
  std::string LeaveRunning(int max_attempts) {
    Make();
    const std::string id = Submit("survivor", 0, max_attempts);
    StartNext();
    pid_ = launcher_->pids.back();
    return id;
  }
  int64_t pid_ = 0;
};

TEST_F(RestartTest, RequeuePolicyRequeuesAndStartsTheNextAttempt) {
  const std::string id = LeaveRunning(3);
  cfg_.requeue_on_restart = true;
  auto& m = Make();
  ASSERT_EQ(launcher_->orphans.size(), 1u);
  EXPECT_EQ(launcher_->orphans[0], std::make_pair(pid_, id));
  const Job j = LastState(id);
  EXPECT_EQ(j.state(), ftd::v1::QUEUED);
  EXPECT_EQ(j.reason(), "DAEMON_RESTART");
  EXPECT_EQ(j.message(), "ftd restarted while attempt 1 of 3 was running; requeued");
  EXPECT_EQ(j.worker_pid(), 0);
  EXPECT_EQ(Get(id).queue_position(), 1);
  m.Tick();
  ASSERT_EQ(launcher_->Launches(), 1u);
  EXPECT_EQ(launcher_->Last().attempt, 2);
  EXPECT_EQ(Counter("ftd_job_retries_total", {{"reason", "daemon_restart"}}), 1);
}

TEST_F(RestartTest, FailPolicyFailsAndSaysWhy) {
  const std::string id = LeaveRunning(3);
  cfg_.requeue_on_restart = false;
  Make();
  const Job j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::FAILED);
  EXPECT_EQ(j.reason(), "DAEMON_RESTART");
  EXPECT_EQ(j.result().outcome(), RunResult::FAILED);
  // Attempts were left: the policy, not the attempts, failed it.
  EXPECT_NE(j.message().find("--restart-policy fail"), std::string::npos) << j.message();
  EXPECT_EQ(j.message().find("no attempts left"), std::string::npos) << j.message();
  ExpectEndedLog(EventLog(id), ftd::v1::FAILED);
  EXPECT_EQ(Counter("ftd_job_completions_total", {{"state", "failed"}, {"outcome", "daemon_restart"}}), 1);
}

TEST_F(RestartTest, RequeuePolicyWithNoAttemptsLeftFails) {
  const std::string id = LeaveRunning(1);
  cfg_.requeue_on_restart = true;
  Make();
  const Job j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::FAILED);
  EXPECT_NE(j.message().find("no attempts left"), std::string::npos) << j.message();
}

TEST_F(RestartTest, TheQueueIsRebuiltInOrder) {
  Make();
  const std::string a = Submit("a", 0), b = Submit("b", 5), c = Submit("c", 0);
  ASSERT_TRUE(manager_->Cancel(a).ok());
  auto& m = Make();
  EXPECT_EQ(Get(b).queue_position(), 1);
  EXPECT_EQ(Get(c).queue_position(), 2);
  m.Tick();
  EXPECT_EQ(launcher_->Last().job_id, b);
}

TEST_F(JobManagerTest, PriorityThenSubmissionOrderDecidesWhichJobStarts) {
  Make();
  const std::string blocker = Submit("blocker");
  LaunchRequest running = StartNext();
  const std::string a = Submit("a", 0), b = Submit("b", 5), c = Submit("c", 0), d = Submit("d", 5), e = Submit("e", -3);
  EXPECT_EQ(Get(b).queue_position(), 1);
  EXPECT_EQ(Get(d).queue_position(), 2);
  EXPECT_EQ(Get(a).queue_position(), 3);
  EXPECT_EQ(Get(c).queue_position(), 4);
  EXPECT_EQ(Get(e).queue_position(), 5);
  std::vector<std::string> started;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(Report(running, RunResult::SUCCEEDED, "").ok());
    launcher_->Exit(running, Exited(0));
    running = StartNext();
    started.push_back(running.job_id);
  }
  EXPECT_EQ(started, (std::vector<std::string>{b, d, a, c, e}));
  (void)blocker;
}

TEST_F(JobManagerTest, OneTickFillsEverySlotInPriorityOrder) {
  cfg_.gpus = 2;
  auto& m = Make();
  const std::string low = Submit("low", 0), mid = Submit("mid", 1), high = Submit("high", 9);
  m.Tick();
  ASSERT_EQ(launcher_->launches.size(), 2u);
  EXPECT_EQ(launcher_->launches[0].job_id, high);
  EXPECT_EQ(launcher_->launches[0].slot, "gpu:0");
  EXPECT_EQ(launcher_->launches[1].job_id, mid);
  EXPECT_EQ(launcher_->launches[1].slot, "gpu:1");
  const Job l = Get(low);
  EXPECT_EQ(l.state(), ftd::v1::QUEUED);
  EXPECT_NE(l.message().find("2 of 2 slot(s) busy"), std::string::npos) << l.message();
}

// The fp8 kernel set is refused at submit, with the reason, by an ftd without GPUs and by one whose
// GPUs have no FP8 tensor cores; an sm_90 ftd takes it.
TEST_F(JobManagerTest, Fp8IsRefusedAtSubmitWithoutAnFp8Gpu) {
  struct Case {
    int gpus, cc;
    const char* why;  // empty: accepted
  };
  for (const Case& c : {Case{0, 0, "which need a GPU, but this ftd has no GPU"},
                        Case{1, 80, "need a GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell), but this "
                                    "ftd's GPU is 8.0"},
                        Case{1, 90, ""}}) {
    cfg_.gpus = c.gpus;
    cfg_.gpu_compute_capability = c.cc;
    auto& m = Make();
    ftd::v1::SubmitJobRequest req;
    req.mutable_spec()->mutable_model()->set_preset("tiny");
    req.mutable_spec()->set_kernel_set("fp8");
    auto r = m.Submit(req);
    if (*c.why == '\0') {
      EXPECT_TRUE(r.ok()) << r.status();
      continue;
    }
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find(c.why), std::string::npos) << r.status();
    EXPECT_EQ(r.status().message().substr(0, 16), "spec.kernel_set ");
  }
}

TEST_F(JobManagerTest, PausedStartsNothing) {
  cfg_.paused = true;
  auto& m = Make();
  const std::string a = Submit("a");
  EXPECT_FALSE(m.Tick().has_value());
  EXPECT_EQ(launcher_->Launches(), 0u);
  const Job j = Get(a);
  EXPECT_EQ(j.reason(), "PAUSED");
}

TEST_F(JobManagerTest, ListAnnotatesPositionsFromTheQueueItKeeps) {
  auto& m = Make();
  std::vector<std::string> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(Submit("j", i % 2 == 0 ? 0 : 1));
  ASSERT_TRUE(m.Cancel(ids[1]).ok());
  ftd::v1::ListJobsRequest req;
  req.set_page_size(3);
  auto page = m.List(req);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->jobs_size(), 3);
  // Queued by priority then submission: ids[3], ids[5], ids[0], ids[2], ids[4]; ids[1] cancelled.
  EXPECT_EQ(page->jobs(0).queue_position(), 3);
  EXPECT_EQ(page->jobs(1).queue_position(), 0);
  EXPECT_EQ(page->jobs(2).queue_position(), 4);
  req.set_page_token(page->next_page_token());
  page = m.List(req);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->jobs_size(), 3);
  EXPECT_EQ(page->jobs(0).queue_position(), 1);
  EXPECT_EQ(page->jobs(1).queue_position(), 5);
  EXPECT_EQ(page->jobs(2).queue_position(), 2);
}

TEST_F(JobManagerTest, DrainRequeuesRunningJobsWithoutSpendingAnAttempt) {
  auto& m = Make();
  const std::string id = Submit("drained", 0, 1);
  const LaunchRequest l = StartNext();
  std::thread drain([&] { m.Drain(std::chrono::steady_clock::now() + std::chrono::minutes(1)); });
  {
    std::unique_lock<std::mutex> lk(launcher_->mu);
    launcher_->cv.wait(lk, [&] { return !launcher_->stops.empty(); });
  }
  ASSERT_TRUE(Report(l, RunResult::CANCELLED, "stopped; checkpoint at step 3").ok());
  launcher_->Exit(l, Exited(5));
  drain.join();
  const Job j = LastState(id);
  EXPECT_EQ(j.state(), ftd::v1::QUEUED);
  EXPECT_EQ(j.reason(), "DAEMON_SHUTDOWN");
  EXPECT_EQ(j.max_attempts(), 1);
  EXPECT_EQ(j.attempt(), 0);  // the drained attempt does not count
  EXPECT_EQ(m.Submit(ftd::v1::SubmitJobRequest()).status().code(), absl::StatusCode::kUnavailable);
  m.Tick();
  EXPECT_EQ(launcher_->Launches(), 1u);  // a draining daemon starts nothing
}

TEST_F(JobManagerTest, AfterADrainAndARestartTheAttemptCountStaysTrue) {
  auto& m = Make();
  const std::string id = Submit("drained", 0, 3);
  const LaunchRequest l = StartNext();
  EXPECT_EQ(Get(id).message(), "attempt 1 of 3 on cpu");
  std::thread drain([&] { m.Drain(std::chrono::steady_clock::now() + std::chrono::minutes(1)); });
  {
    std::unique_lock<std::mutex> lk(launcher_->mu);
    launcher_->cv.wait(lk, [&] { return !launcher_->stops.empty(); });
  }
  launcher_->Exit(l, Exited(5));
  drain.join();
  Make();  // the next daemon on the same store
  StartNext();
  const Job j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::RUNNING);
  EXPECT_EQ(j.message(), "attempt 1 of 3 on cpu");
  EXPECT_EQ(j.attempt(), 1);
  EXPECT_EQ(j.max_attempts(), 3);
}

TEST_F(JobManagerTest, MaxAttemptsZeroIsRefusedNamingTheField) {
  Make();
  ftd::v1::SubmitJobRequest req;
  req.mutable_spec()->mutable_model()->set_preset("tiny");
  req.mutable_spec()->set_device("cpu");
  req.set_max_attempts(0);
  const auto r = manager_->Submit(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("max_attempts must be in [1, 20] (got 0)"), std::string::npos) << r.status();
  req.clear_max_attempts();  // unset: the default
  const auto ok = manager_->Submit(req);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->job().max_attempts(), 3);
}

TEST_F(JobManagerTest, ARequestIdReusedWithAnotherRequestIsRefusedAndARetryGetsTheSameJob) {
  Make();
  ftd::v1::SubmitJobRequest req;
  req.set_name("first");
  req.set_request_id("req-42");
  req.mutable_spec()->mutable_model()->set_preset("tiny");
  req.mutable_spec()->set_device("cpu");
  req.mutable_spec()->set_steps(10);
  const auto first = manager_->Submit(req);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->created());
  const auto again = manager_->Submit(req);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created());
  EXPECT_EQ(again->job().id(), first->job().id());

  ftd::v1::SubmitJobRequest other = req;
  other.mutable_spec()->set_steps(20);
  other.set_name("second");
  const auto clash = manager_->Submit(other);
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(clash.status().message().find(first->job().id()), std::string::npos) << clash.status();
  EXPECT_NE(clash.status().message().find("differs in: name, spec.steps"), std::string::npos) << clash.status();
  EXPECT_EQ(store_->CountInState(ftd::v1::QUEUED).value(), 1);
}

TEST_F(JobManagerTest, AWatchWakesOnANewEventAndEndsAfterTheResult) {
  auto& m = Make();
  const std::string id = Submit("watched");
  auto watch = m.WatchJob(id, 0);
  ASSERT_TRUE(watch.ok());
  bool done = true;
  auto first = (*watch)->Next(std::chrono::milliseconds(0), &done);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->size(), 1u);  // the QUEUED state
  EXPECT_FALSE(done);
  auto none = (*watch)->Next(std::chrono::milliseconds(0), &done);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  const LaunchRequest l = StartNext();  // the RUNNING state event
  absl::StatusOr<std::vector<JobEvent>> got;
  // Waits in another thread until the step below arrives: woken by it, long before the deadline.
  const auto t0 = std::chrono::steady_clock::now();
  std::thread watcher([&] {
    std::vector<JobEvent> all;
    while (all.empty() || !all.back().has_step()) {
      auto evs = (*watch)->Next(std::chrono::seconds(60), &done);
      if (!evs.ok()) {
        got = evs.status();
        return;
      }
      all.insert(all.end(), evs->begin(), evs->end());
    }
    got = all;
  });
  ASSERT_TRUE(Step(l, 1).ok());
  watcher.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[0].state().state(), ftd::v1::RUNNING);
  EXPECT_EQ((*got)[1].step().step(), 1);

  ASSERT_TRUE(Report(l, RunResult::SUCCEEDED, "").ok());
  launcher_->Exit(l, Exited(0));
  auto last = (*watch)->Next(std::chrono::seconds(60), &done);
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(done);
  ASSERT_EQ(last->size(), 2u);
  EXPECT_TRUE(last->back().has_result());
}

TEST_F(JobManagerTest, CloseWatchesEndsAWaitingWatch) {
  auto& m = Make();
  const std::string id = Submit("w");
  auto watch = m.WatchJob(id, 1);
  ASSERT_TRUE(watch.ok());
  const auto t0 = std::chrono::steady_clock::now();
  std::thread closer([&] { m.CloseWatches(); });
  bool done = false;
  auto evs = (*watch)->Next(std::chrono::seconds(60), &done);  // returns once closed
  closer.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  ASSERT_TRUE(evs.ok());
  EXPECT_TRUE(evs->empty());
}

TEST_F(JobManagerTest, StepCountersCountEveryStepWhenReportsAreSparse) {
  auto& m = Make();
  Submit("sparse");
  const LaunchRequest l = StartNext();
  for (int s : {4, 8, 10}) ASSERT_TRUE(Step(l, s).ok());
  ASSERT_TRUE(Step(l, 8).ok());  // a repeated report adds nothing
  EXPECT_EQ(Counter("ftd_worker_steps_total", {{"slot", "cpu"}, {"kernel_set", "eager"}}), 10);
  EXPECT_EQ(Counter("ftd_worker_tokens_total", {{"slot", "cpu"}, {"kernel_set", "eager"}}), 10 * 128);
  (void)m;
}

// A 3.9 MB path once made an 11.98 MB job record and 24 MB of events (every message quoted it).
TEST_F(JobManagerTest, AHugeStringIsRefusedAtSubmitAndWorkerTextIsClipped) {
  auto& m = Make();
  ftd::v1::SubmitJobRequest req;
  req.mutable_spec()->mutable_model()->set_preset("tiny");
  req.mutable_spec()->set_device("cpu");
  req.mutable_spec()->mutable_data()->set_path("/" + std::string(3'900'000, 'x'));
  auto r = m.Submit(req);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_EQ(r.status().message().substr(0, 15), "spec.data.path ");
  EXPECT_LT(r.status().message().size(), 400u);
  req.mutable_spec()->mutable_data()->clear_path();
  req.set_owner("bad\xff");
  EXPECT_EQ(m.Submit(req).status().code(), absl::StatusCode::kInvalidArgument);

  const std::string id = Submit("clip");
  const LaunchRequest l = StartNext();
  ftd::v1::WorkerMessage log;
  log.set_log(std::string(1'000'000, 'l'));
  ASSERT_TRUE(Send(l, log).ok());
  ASSERT_TRUE(Report(l, RunResult::FAILED, "cannot open " + std::string(2'000'000, 'p') + ": not found").ok());
  launcher_->Exit(l, Exited(1));
  const Job j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::FAILED);
  EXPECT_LT(j.ByteSizeLong(), 3 * kMaxWorkerText);
  EXPECT_NE(j.message().find(": not found"), std::string::npos) << "the end of the error is kept";
  size_t events = 0;
  for (const auto& e : EventLog(id)) events += e.ByteSizeLong();
  EXPECT_LT(events, 10 * kMaxWorkerText);
}

// An OOM-killed worker used to be KILLED_BY_SIGNAL and retried, drawing on the host's memory again.
TEST_F(JobManagerTest, AWorkerTheOomKillerKilledIsOutOfMemoryAndNotRetried) {
  auto& m = Make();
  const std::string id = Submit("oom", 0, 3);
  const LaunchRequest l = StartNext();
  ExitStatus st = Signaled(SIGKILL);
  st.oom_killed = true;
  st.memory_limit_bytes = int64_t{64} << 20;
  st.memory_peak_bytes = int64_t{64} << 20;
  launcher_->Exit(l, st);
  const Job j = Get(id);
  EXPECT_EQ(j.state(), ftd::v1::FAILED);
  EXPECT_EQ(j.reason(), "HOST_OUT_OF_MEMORY");
  EXPECT_EQ(j.attempt(), 1);
  EXPECT_NE(j.message().find("memory limit of 64 MiB"), std::string::npos) << j.message();
  EXPECT_NE(j.message().find("spec.batch_size"), std::string::npos) << j.message();
  m.Tick();
  EXPECT_EQ(launcher_->Launches(), 1u);
  // The same SIGKILL without the OOM killer's mark is still an infrastructure failure.
  const std::string other = Submit("killed", 0, 3);
  launcher_->Exit(StartNext(), Signaled(SIGKILL));
  EXPECT_EQ(Get(other).reason(), "KILLED_BY_SIGNAL");
  EXPECT_EQ(Get(other).state(), ftd::v1::QUEUED);
}

// batch_size=20000 with seq_len=2048, or batch_size=1e9, once passed submission and died later.
TEST_F(JobManagerTest, AJobThatCannotFitTheMachineIsRefusedAtSubmit) {
  cfg_.memory = {int64_t{16} << 30, 0};
  auto& m = Make();
  ftd::v1::SubmitJobRequest req;
  req.mutable_spec()->mutable_model()->set_preset("tiny");
  req.mutable_spec()->set_device("cpu");
  // (1e9 is beyond batch_size's static bound, which refuses it first: SubmitRefusesWhatTheParserLetsThrough...)
  for (auto [batch, seq] : {std::pair{20000, 2048}, std::pair{65'536, 2048}}) {
    req.mutable_spec()->set_batch_size(batch);
    req.mutable_spec()->set_seq_len(seq);
    auto r = m.Submit(req);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_EQ(r.status().message().substr(0, 16), "spec.batch_size:") << r.status();
    EXPECT_NE(r.status().message().find("16.0 GiB"), std::string::npos) << r.status();
  }
  req.mutable_spec()->set_batch_size(8);
  req.mutable_spec()->set_seq_len(128);
  EXPECT_TRUE(m.Submit(req).ok());
}

TEST_F(JobManagerTest, TheCpuSlotExportsNoGpuSeries) {
  auto& m = Make();  // no GPUs: one CPU slot
  Submit("on-the-cpu");
  const LaunchRequest l = StartNext();
  ASSERT_EQ(l.slot, "cpu");
  ASSERT_TRUE(Step(l, 1).ok());
  std::set<std::string> kinds, gpu_families;
  for (const auto& f : metrics_->registry()->Collect()) {
    for (const auto& series : f.metric) {
      std::map<std::string, std::string> labels;
      for (const auto& lp : series.label) labels[lp.name] = lp.value;
      if (f.name == "ftd_worker_peak_memory_bytes") kinds.insert(labels["kind"]);
      if (labels["slot"] == "cpu" && (f.name.find("gpu") != std::string::npos || f.name.find("power") != std::string::npos ||
                                      f.name.find("energy") != std::string::npos || f.name.find("joules") != std::string::npos)) {
        gpu_families.insert(f.name);
      }
    }
  }
  EXPECT_EQ(kinds, std::set<std::string>{"host_rss"});
  EXPECT_TRUE(gpu_families.empty()) << (gpu_families.empty() ? "" : *gpu_families.begin());
  (void)m;
}

TEST_F(JobManagerTest, StateGaugeFollowsTransitions) {
  auto& m = Make();
  const std::string a = Submit("a");
  Submit("b");
  EXPECT_EQ(Counter("ftd_jobs", {{"state", "queued"}}), 2);
  const LaunchRequest l = StartNext();
  EXPECT_EQ(Counter("ftd_jobs", {{"state", "queued"}}), 1);
  EXPECT_EQ(Counter("ftd_jobs", {{"state", "running"}}), 1);
  ASSERT_TRUE(Report(l, RunResult::SUCCEEDED, "").ok());
  launcher_->Exit(l, Exited(0));
  EXPECT_EQ(Counter("ftd_jobs", {{"state", "running"}}), 0);
  EXPECT_EQ(Counter("ftd_jobs", {{"state", "succeeded"}}), 1);
  (void)m;
  (void)a;
}

// SubmitJob is where a spec crosses into the daemon: what protobuf's parser lets through (an
// unknown enum value, fields this build lacks, NaN and infinities) and out-of-bounds numbers are
// refused there, naming the field, and nothing is stored.
TEST_F(JobManagerTest, SubmitRefusesWhatTheParserLetsThroughNamingTheField) {
  Make();
  auto valid = [] {
    ftd::v1::SubmitJobRequest req;
    req.mutable_spec()->mutable_model()->set_preset("tiny");
    req.mutable_spec()->set_device("cpu");
    return req;
  };
  auto refused = [&](const ftd::v1::SubmitJobRequest& req) {
    auto r = manager_->Submit(req);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    return std::string(r.status().message());
  };
  auto kind = valid();
  kind.set_kind(static_cast<ftd::v1::JobKind>(99));
  EXPECT_EQ(refused(kind), "kind is 99, not a JobKind value: use one of FINETUNE, PROFILE");
  auto eps = valid();
  eps.mutable_spec()->mutable_optimizer()->set_eps(std::numeric_limits<double>::infinity());
  EXPECT_EQ(refused(eps), "spec.optimizer.eps must be a finite number (got inf)");
  auto flops = valid();
  flops.mutable_spec()->set_peak_flops(std::numeric_limits<double>::infinity());
  EXPECT_EQ(refused(flops), "spec.peak_flops must be a finite number (got inf)");
  auto unknown = valid();
  std::string bytes;
  ASSERT_TRUE(unknown.spec().SerializeToString(&bytes));
  for (char c : {'\xf8', '\x07', '\x01'}) bytes.push_back(c);  // field 127, varint 1
  ASSERT_TRUE(unknown.mutable_spec()->ParseFromString(bytes));
  EXPECT_NE(refused(unknown).find("spec holds field number 127 (varint), which this build of ftd does not know"),
            std::string::npos);
  auto batch = valid();
  batch.mutable_spec()->set_batch_size(1'000'000'000);
  EXPECT_EQ(refused(batch), "spec.batch_size must be <= 65536 (got 1000000000)");
  auto list = manager_->List(ftd::v1::ListJobsRequest());
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->jobs_size(), 0);
}

}  // namespace
}  // namespace ftd::server

namespace ftd::server {
namespace {

ftd::v1::WorkerMessage CheckpointProgress(int64_t done, int64_t total) {
  ftd::v1::WorkerMessage m;
  m.mutable_progress()->set_phase("save_checkpoint");
  m.mutable_progress()->set_done_bytes(done);
  m.mutable_progress()->set_total_bytes(total);
  return m;
}

TEST_F(JobManagerTest, CancelStopsWithoutACheckpointUnlessAskedAndProgressPostponesTheKill) {
  auto& m = Make();
  const std::string a = Submit("plain");
  const LaunchRequest la = StartNext();
  auto c = m.Cancel(a);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(c->message().find("without a checkpoint"), std::string::npos) << c->message();
  ASSERT_EQ(launcher_->stop_modes.size(), 1u);
  EXPECT_EQ(launcher_->stop_modes[0], StopMode::kNoCheckpoint);
  // A worker stopping without a checkpoint gets no extension whatever it reports.
  ASSERT_TRUE(Send(la, CheckpointProgress(10, 100)).ok());
  EXPECT_TRUE(launcher_->postponed.empty());
  launcher_->Exit(la, Exited(5));
  EXPECT_EQ(Get(a).state(), ftd::v1::CANCELLED);

  const std::string b = Submit("with-checkpoint");
  const LaunchRequest lb = StartNext();
  c = m.Cancel(b, "alice", /*checkpoint=*/true);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(c->message().find("after a checkpoint"), std::string::npos) << c->message();
  ASSERT_EQ(launcher_->stop_modes.size(), 2u);
  EXPECT_EQ(launcher_->stop_modes[1], StopMode::kCheckpoint);
  ASSERT_TRUE(Send(lb, CheckpointProgress(0, 100)).ok());
  ASSERT_TRUE(Send(lb, CheckpointProgress(50, 100)).ok());
  ASSERT_EQ(launcher_->postponed.size(), 2u);
  EXPECT_EQ(launcher_->postponed[1], std::make_pair(launcher_->pids[1], static_cast<int64_t>(cfg_.grace_ms)));
  launcher_->Exit(lb, Exited(5));
  EXPECT_EQ(Get(b).state(), ftd::v1::CANCELLED);
}

TEST_F(JobManagerTest, ACheckpointWriteShowsInGetWithItsPredictedEndWhichThePostponementCovers) {
  auto& m = Make();
  const std::string a = Submit("big");
  const LaunchRequest la = StartNext();
  ASSERT_TRUE(Step(la, 4).ok());
  EXPECT_FALSE(Get(a).has_phase());
  auto progress = [](int64_t done, std::optional<double> eta) {
    auto msg = CheckpointProgress(done, int64_t{48} << 30);
    msg.mutable_progress()->set_step(4);
    if (eta) msg.mutable_progress()->set_eta_s(*eta);
    return msg;
  };
  ASSERT_TRUE(Send(la, progress(0, std::nullopt)).ok());  // the first write: no rate measured yet
  EXPECT_EQ(Get(a).phase().phase(), "save_checkpoint");
  EXPECT_FALSE(Get(a).phase().has_eta_s());
  ASSERT_TRUE(Send(la, progress(int64_t{12} << 30, 25.2)).ok());
  ASSERT_TRUE(Send(la, progress(int64_t{24} << 30, 12.0)).ok());
  const Job j = Get(a);
  EXPECT_EQ(j.phase().done_bytes(), int64_t{24} << 30);
  EXPECT_EQ(j.phase().after_step(), 4);
  EXPECT_DOUBLE_EQ(j.phase().eta_s(), 12.0);
  std::vector<std::string> notes;
  for (const auto& e : EventLog(a)) {
    if (e.has_log()) notes.push_back(e.log());
  }
  EXPECT_EQ(notes, std::vector<std::string>{"writing the checkpoint after step 4: 12.0 GiB of 48.0 GiB, about 26s left"})
      << "once per write, from the first report with a prediction";
  // A stop with a checkpoint waits for the predicted end (with a margin), not only the grace period.
  ASSERT_TRUE(m.Cancel(a, "alice", /*checkpoint=*/true).ok());
  ASSERT_TRUE(Send(la, progress(int64_t{30} << 30, 10.0)).ok());
  ASSERT_FALSE(launcher_->postponed.empty());
  EXPECT_EQ(launcher_->postponed.back(), std::make_pair(launcher_->pids[0], int64_t{15000}));
  ASSERT_TRUE(Send(la, progress(int64_t{47} << 30, 0.5)).ok());
  EXPECT_EQ(launcher_->postponed.back(), std::make_pair(launcher_->pids[0], static_cast<int64_t>(cfg_.grace_ms)));
  ASSERT_TRUE(Step(la, 5).ok());
  EXPECT_FALSE(Get(a).has_phase()) << "a step ends the phase";
  ASSERT_TRUE(Send(la, progress(0, 3.0)).ok());
  launcher_->Exit(la, Exited(5));
  EXPECT_FALSE(Get(a).has_phase()) << "an ended job has none";
}

TEST_F(JobManagerTest, PauseAndResumeWithoutARestart) {
  auto& m = Make();
  const std::string a = Submit("a");
  auto st = m.SetPaused(true);
  EXPECT_TRUE(st.paused());
  EXPECT_EQ(st.queued(), 1);
  m.Tick();
  EXPECT_EQ(launcher_->Launches(), 0u);
  EXPECT_EQ(Get(a).reason(), "PAUSED");
  EXPECT_NE(Get(a).message().find("ftctl resume"), std::string::npos) << Get(a).message();
  st = m.SetPaused(false);
  EXPECT_FALSE(st.paused());
  m.Tick();
  EXPECT_EQ(launcher_->Launches(), 1u);
  EXPECT_EQ(m.Scheduler().busy(), 1);
}

TEST_F(JobManagerTest, StepReportsAreWrittenToTheJobsLog) {
  Make();
  const std::string id = Submit("logged");
  const LaunchRequest l = StartNext();
  ASSERT_TRUE(Step(l, 1).ok());
  ASSERT_TRUE(Step(l, 2).ok());
  auto log = manager_->Log(id);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_FALSE(log->ended);
  std::ifstream in(log->path);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("[ftd] step 1 loss"), std::string::npos) << ss.str();
  EXPECT_NE(ss.str().find("[ftd] step 2 loss"), std::string::npos) << ss.str();
}

class RemovalTest : public JobManagerTest {
 protected:
  // A job that ran and ended as `outcome`, with files in its directory.
  std::string Finished(const std::string& name, RunResult::Outcome outcome) {
    const std::string id = Submit(name);
    const LaunchRequest l = StartNext();
    const fs::path ck = fs::path(dir_) / "jobs" / id / "checkpoints";
    fs::create_directories(ck / "step-00000003");
    std::ofstream(ck / "step-00000003" / "model.safetensors") << std::string(1000, 'w');
    std::ofstream(ck / "step-00000003" / "MANIFEST.json") << "{}";
    fs::create_directories(ck / "step-00000004.tmp");
    std::ofstream(ck / "step-00000004.tmp" / "model.safetensors") << std::string(500, 'p');
    EXPECT_TRUE(Report(l, outcome, "done").ok());
    launcher_->Exit(l, Exited(outcome == RunResult::SUCCEEDED ? 0 : 1));
    return id;
  }
  bool Exists(const std::string& id) { return store_->Get(id).ok(); }
};

TEST_F(RemovalTest, DeleteRemovesAFinishedJobAndItsFilesButNotAQueuedOne) {
  Make();
  const std::string done = Finished("done", RunResult::SUCCEEDED);
  const std::string queued = Submit("queued");
  auto r = manager_->Delete(done);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GE(r->freed_bytes, 1500);
  EXPECT_FALSE(Exists(done));
  EXPECT_FALSE(fs::exists(fs::path(dir_) / "jobs" / done));
  EXPECT_EQ(manager_->Delete(queued).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->Delete(done).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Exists(queued));
}

TEST_F(RemovalTest, PruneTakesStateAndAgeIntoAccount) {
  Make();
  const std::string old_ok = Finished("old-ok", RunResult::SUCCEEDED);
  const std::string old_failed = Finished("old-failed", RunResult::FAILED);
  clock_.Advance(8 * 86400'000LL);
  const std::string new_ok = Finished("new-ok", RunResult::SUCCEEDED);
  PruneFilter f;
  f.older_than_ms = 7 * 86400'000LL;
  f.states = {ftd::v1::SUCCEEDED};
  f.dry_run = true;
  auto r = manager_->Prune(f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ids, std::vector<std::string>{old_ok});
  EXPECT_TRUE(Exists(old_ok));  // a dry run deletes nothing
  f.dry_run = false;
  r = manager_->Prune(f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ids, std::vector<std::string>{old_ok});
  EXPECT_FALSE(Exists(old_ok));
  EXPECT_TRUE(Exists(old_failed));
  EXPECT_TRUE(Exists(new_ok));
  f.states = {ftd::v1::RUNNING};
  EXPECT_EQ(manager_->Prune(f).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RemovalTest, RetentionRunsOnTheClockAndRemovesPartialCheckpoints) {
  cfg_.retention_ms = 30 * 86400'000LL;
  cfg_.retention_check_ms = 3600'000;
  auto& m = Make();
  const std::string old_job = Finished("old", RunResult::SUCCEEDED);
  clock_.Advance(29 * 86400'000LL);
  const std::string recent = Finished("recent", RunResult::FAILED);
  const fs::path tmp = fs::path(dir_) / "jobs" / recent / "checkpoints" / "step-00000004.tmp";
  ASSERT_TRUE(fs::exists(tmp));
  // An orphan directory: a job the store no longer has.
  fs::create_directories(fs::path(dir_) / "jobs" / "j-999999" / "checkpoints");
  clock_.Advance(2 * 86400'000LL);
  const auto wait = m.Tick();  // the first retention run is due at once
  EXPECT_FALSE(Exists(old_job));
  EXPECT_TRUE(Exists(recent));
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_TRUE(fs::exists(fs::path(dir_) / "jobs" / recent / "checkpoints" / "step-00000003" / "MANIFEST.json"));
  EXPECT_FALSE(fs::exists(fs::path(dir_) / "jobs" / "j-999999"));
  ASSERT_TRUE(wait.has_value());
  EXPECT_LE(wait->count(), cfg_.retention_check_ms);  // it asked to run again
  clock_.Advance(30 * 86400'000LL);  // past the recent job's retention and the next check
  m.Tick();
  EXPECT_FALSE(Exists(recent));
}

TEST_F(RemovalTest, ResumeStartsANewJobFromTheNewestCheckpoint) {
  Make();
  const std::string failed = Finished("to-resume", RunResult::FAILED);
  ftd::v1::ResubmitJobRequest req;
  req.set_id(failed);
  req.set_resume(true);
  req.add_set("steps=20");
  auto r = manager_->Resubmit(req);
  ASSERT_TRUE(r.ok()) << r.status();
  const Job& j = r->job();
  EXPECT_NE(j.id(), failed);
  EXPECT_EQ(j.name(), "to-resume");
  EXPECT_EQ(j.spec().steps(), 20);
  EXPECT_TRUE(j.spec().checkpoint().resume());
  const fs::path ck = fs::path(dir_) / "jobs" / j.id() / "checkpoints";
  EXPECT_TRUE(fs::exists(ck / "step-00000003" / "MANIFEST.json"));
  EXPECT_FALSE(fs::exists(ck / "step-00000004.tmp"));  // only the complete checkpoint
  // The original keeps its files; deleting it leaves the copy intact.
  ASSERT_TRUE(manager_->Delete(failed).ok());
  EXPECT_TRUE(fs::exists(ck / "step-00000003" / "model.safetensors"));
  EXPECT_EQ(fs::file_size(ck / "step-00000003" / "model.safetensors"), 1000u);

  // A succeeded job is not resumed; a bad override names itself.
  const std::string ok = Finished("ok", RunResult::SUCCEEDED);
  req.set_id(ok);
  EXPECT_EQ(manager_->Resubmit(req).status().code(), absl::StatusCode::kFailedPrecondition);
  req.set_resume(false);
  req.clear_set();
  req.add_set("no_such_field=1");
  const auto bad = manager_->Resubmit(req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("no_such_field"), std::string::npos) << bad.status();
}

// ---------------------------------------------------------------------------------------------
// Several jobs per GPU, per-user limits, fair share

class SharingTest : public JobManagerTest {
 protected:
  // A job of `owner`; on the GPU unless `cpu`.
  absl::StatusOr<ftd::v1::SubmitJobResponse> SubmitAs(const std::string& owner, const std::string& name,
                                                      bool cpu = true, bool validate_only = false, int gpus = 1) {
    ftd::v1::SubmitJobRequest req;
    req.set_name(name);
    req.set_owner(owner);
    req.set_validate_only(validate_only);
    auto* spec = req.mutable_spec();
    spec->mutable_model()->set_preset("tiny");
    spec->set_batch_size(4);
    spec->set_seq_len(32);
    spec->set_device(cpu ? "cpu" : "cuda");
    spec->set_steps(10);
    if (gpus > 1) spec->set_gpus(gpus);
    return manager_->Submit(req);
  }
  std::string Id(const absl::StatusOr<ftd::v1::SubmitJobResponse>& r) {
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->job().id() : "";
  }
  // Ends the attempt as a success.
  void Succeed(const LaunchRequest& l) {
    ASSERT_TRUE(Report(l, RunResult::SUCCEEDED, "done").ok());
    launcher_->Exit(l, Exited(0));
  }
  static constexpr int64_t kHour = 3600'000;
};

TEST_F(SharingTest, JobsShareAGpuWhileTheirPredictedPeaksFitAndAnOomLeavesTheNeighbourRunning) {
  cfg_.gpus = 1;
  cfg_.jobs_per_gpu = 3;
  cfg_.gpu_margin_bytes = 0;
  Make();
  const std::string a = Id(SubmitAs("u", "a", false));
  const int64_t peak = Get(a).predicted_peak_bytes();
  ASSERT_GT(peak, 0);
  // Room for two such jobs and a half: the third waits for memory.
  cfg_.memory.gpu_bytes = peak * 5 / 2;
  Make();
  const std::string b = Id(SubmitAs("u", "b", false)), c = Id(SubmitAs("u", "c", false));
  manager_->Tick();
  ASSERT_EQ(launcher_->Launches(), 2u);
  EXPECT_EQ(launcher_->launches[0].slot, "gpu:0/0");
  EXPECT_EQ(launcher_->launches[1].slot, "gpu:0/1");
  EXPECT_EQ(launcher_->launches[0].gpu, 0);
  EXPECT_EQ(launcher_->launches[1].gpu, 0);
  EXPECT_EQ(Get(b).slot(), "gpu:0/1");
  const Job waiting = Get(c);
  EXPECT_EQ(waiting.reason(), "WAITING_FOR_MEMORY") << waiting.message();
  EXPECT_NE(waiting.message().find("fits on no GPU now"), std::string::npos) << waiting.message();
  EXPECT_EQ(Counter("ftd_gpu_jobs", {{"gpu", "0"}}), 2);
  EXPECT_EQ(Counter("ftd_gpu_predicted_bytes", {{"gpu", "0"}}), static_cast<double>(2 * peak));
  // The first runs out of GPU memory: it fails as a job alone would; its neighbour runs on, and
  // the waiting job takes the freed room.
  const LaunchRequest first = launcher_->launches[0], second = launcher_->launches[1];
  ASSERT_TRUE(manager_->Assign(Hello(first)).ok());
  ASSERT_TRUE(Report(first, RunResult::OUT_OF_MEMORY, "CUDA out of memory").ok());
  launcher_->Exit(first, Exited(3));
  EXPECT_EQ(Get(a).state(), ftd::v1::FAILED);
  EXPECT_EQ(Get(b).state(), ftd::v1::RUNNING);
  EXPECT_TRUE(launcher_->kills.empty());
  EXPECT_TRUE(launcher_->stops.empty());
  manager_->Tick();
  ASSERT_EQ(launcher_->Launches(), 3u);
  EXPECT_EQ(launcher_->Last().job_id, c);
  EXPECT_EQ(launcher_->Last().slot, "gpu:0/0");
  (void)second;
}

TEST_F(SharingTest, AJobOnTwoGpusTakesTwoWholeGpusAtOnceOrWaitsHoldingItsPlace) {
  cfg_.gpus = 2;
  cfg_.jobs_per_gpu = 2;
  cfg_.memory.gpu_bytes = int64_t{80} << 30;
  cfg_.gpu_margin_bytes = 0;
  Make();
  const std::string small = Id(SubmitAs("u", "small", false));
  manager_->Tick();
  ASSERT_EQ(launcher_->Launches(), 1u);
  EXPECT_EQ(launcher_->Last().slot, "gpu:0/0");
  // GPU 1 is free and GPU 0 has a free slot, but only one GPU has no job on it: the 2-GPU job
  // waits, and the job behind it does not take the room it waits for.
  const std::string big = Id(SubmitAs("u", "big", false, false, 2));
  const std::string after = Id(SubmitAs("u", "after", false));
  manager_->Tick();
  EXPECT_EQ(launcher_->Launches(), 1u);
  const Job waiting = Get(big);
  EXPECT_EQ(waiting.reason(), "WAITING_FOR_GPUS") << waiting.message();
  EXPECT_NE(waiting.message().find("waits for 2 free GPUs at once"), std::string::npos) << waiting.message();
  EXPECT_NE(waiting.message().find("1 with no job on them now"), std::string::npos) << waiting.message();
  EXPECT_EQ(Get(after).state(), ftd::v1::QUEUED);
  // The small job ends: both GPUs are whole; the big job takes both at once as two ranks, and
  // nothing joins it on them.
  const LaunchRequest first = launcher_->Last();
  ASSERT_TRUE(manager_->Assign(Hello(first)).ok());
  Succeed(first);
  manager_->Tick();
  ASSERT_EQ(launcher_->Launches(), 2u);
  const LaunchRequest both = launcher_->Last();
  EXPECT_EQ(both.job_id, big);
  EXPECT_EQ(both.ranks, 2);
  EXPECT_EQ(both.gpu, 0);
  EXPECT_EQ(both.more_gpus, std::vector<int>{1});
  EXPECT_EQ(both.slot, "gpu:0/0");
  EXPECT_EQ(both.more_slots, std::vector<std::string>{"gpu:1/0"});
  EXPECT_EQ(Get(big).state(), ftd::v1::RUNNING);
  EXPECT_EQ(Get(after).state(), ftd::v1::QUEUED);
  // It ends: its GPUs are free again for the job behind it.
  ASSERT_TRUE(manager_->Assign(Hello(both)).ok());
  Succeed(both);
  manager_->Tick();
  ASSERT_EQ(launcher_->Launches(), 3u);
  EXPECT_EQ(launcher_->Last().job_id, after);
}

TEST_F(SharingTest, ValidateOnlyOnACpuDaemonWithItsSlotBusySaysSoAndNothingOfGpuMemory) {
  // A spec without a device on a daemon without GPUs: the placement spoke of "a slot with enough
  // GPU memory".
  cfg_.gpus = 0;
  Make();
  auto plain = [&](bool validate_only) {
    ftd::v1::SubmitJobRequest req;
    req.set_owner("u");
    req.set_validate_only(validate_only);
    req.mutable_spec()->mutable_model()->set_preset("tiny");
    req.mutable_spec()->set_steps(10);
    return manager_->Submit(req);
  };
  auto idle = plain(true);
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_EQ(idle->placement(), "it would start on the CPU slot now");
  Id(plain(false));
  manager_->Tick();
  ASSERT_EQ(launcher_->Launches(), 1u);
  Id(plain(false));
  auto busy = plain(true);
  ASSERT_TRUE(busy.ok()) << busy.status();
  EXPECT_EQ(busy->placement(),
            "the CPU slot is busy: it would wait for it, and once the 1 queued job(s) ahead of it have had their turn");
}

TEST_F(SharingTest, OneJobPerGpuKeepsTheSlotNamesAndTheirGpus) {
  cfg_.gpus = 2;
  cfg_.memory.gpu_bytes = int64_t{80} << 30;
  Make();
  Id(SubmitAs("u", "a", false));
  Id(SubmitAs("u", "b", false));
  manager_->Tick();
  ASSERT_EQ(launcher_->Launches(), 2u);
  EXPECT_EQ(launcher_->launches[0].slot, "gpu:0");
  EXPECT_EQ(launcher_->launches[1].slot, "gpu:1");
  EXPECT_EQ(launcher_->launches[1].gpu, 1);
}

TEST_F(SharingTest, ValidateOnlyPredictsAndPlacesWithoutCreatingAJob) {
  cfg_.gpus = 1;
  cfg_.jobs_per_gpu = 2;
  cfg_.memory.gpu_bytes = int64_t{80} << 30;
  Make();
  auto r = SubmitAs("u", "probe", false, /*validate_only=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->created());
  EXPECT_TRUE(r->job().id().empty());
  EXPECT_GT(r->predicted_peak_bytes(), 0);
  EXPECT_EQ(r->job().predicted_peak_bytes(), r->predicted_peak_bytes());
  EXPECT_NE(r->placement().find("it would start on GPU 0"), std::string::npos) << r->placement();
  ftd::v1::ListJobsRequest all;
  EXPECT_EQ(manager_->List(all)->jobs_size(), 0);
  // What a submit would refuse, validation refuses the same way.
  ftd::v1::SubmitJobRequest big;
  big.set_validate_only(true);
  big.mutable_spec()->mutable_model()->set_preset("tiny");
  big.mutable_spec()->set_device("cuda");
  big.mutable_spec()->set_batch_size(20000);
  big.mutable_spec()->set_seq_len(2048);
  auto refused = manager_->Submit(big);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("80.0 GiB"), std::string::npos) << refused.status();
}

TEST_F(SharingTest, AUserOverTheQueuedLimitIsRefusedWithTheLimitAndTheUse) {
  cfg_.quotas.defaults.max_queued = 2;
  Make();
  Id(SubmitAs("alice", "1"));
  Id(SubmitAs("alice", "2"));
  auto third = SubmitAs("alice", "3");
  ASSERT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  EXPECT_NE(third.status().message().find("user alice has 2 job(s) queued"), std::string::npos) << third.status();
  EXPECT_NE(third.status().message().find("(queued=2)"), std::string::npos) << third.status();
  Id(SubmitAs("bob", "1"));  // others are not held to alice's count
}

TEST_F(SharingTest, AUserAtTheRunningLimitWaitsWhileOthersStart) {
  cfg_.gpus = 3;
  cfg_.quotas.users["alice"].max_running = 1;
  Make();
  const std::string a1 = Id(SubmitAs("alice", "1")), a2 = Id(SubmitAs("alice", "2")), b1 = Id(SubmitAs("bob", "1"));
  manager_->Tick();
  ASSERT_EQ(launcher_->Launches(), 2u);
  EXPECT_EQ(launcher_->launches[0].job_id, a1);
  EXPECT_EQ(launcher_->launches[1].job_id, b1);
  const Job w = Get(a2);
  EXPECT_EQ(w.reason(), "QUOTA");
  EXPECT_NE(w.message().find("user alice runs 1 job(s), the limit for the user (running=1)"), std::string::npos)
      << w.message();
}

TEST_F(SharingTest, GpuHoursOverTheWindowAreRefusedAndHeldUntilTheyLeaveItAcrossARestart) {
  cfg_.quotas.users["alice"].gpu_hours = 1.5;
  cfg_.quotas.window_ms = 24 * kHour;
  Make();
  const std::string a1 = Id(SubmitAs("alice", "1")), a2 = Id(SubmitAs("alice", "2"));
  const LaunchRequest l = StartNext();
  clock_.Advance(2 * kHour);
  Succeed(l);
  // 2 hours used of 1.5 (of the CPU slot: this daemon has no GPU, and its messages say so): a new
  // submit is refused; the queued job waits.
  auto over = SubmitAs("alice", "3");
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_NE(over.status().message().find("user alice has used 2.0 CPU-slot hours in the last 24 h"), std::string::npos)
      << over.status();
  EXPECT_NE(over.status().message().find("(gpu-hours=1.5)"), std::string::npos) << over.status();
  manager_->Tick();
  EXPECT_EQ(launcher_->Launches(), 1u);
  EXPECT_EQ(Get(a2).reason(), "QUOTA");
  // The usage is in the store: a restarted daemon holds her the same way.
  Make();
  manager_->Tick();
  EXPECT_EQ(launcher_->Launches(), 0u);
  EXPECT_EQ(SubmitAs("alice", "3").status().code(), absl::StatusCode::kResourceExhausted);
  // 23 hours on, one of the two hours is still in the window: 1 < 1.5, she may start again.
  clock_.Advance(23 * kHour);
  manager_->Tick();
  ASSERT_EQ(launcher_->Launches(), 1u);
  EXPECT_EQ(launcher_->Last().job_id, a2);
  (void)a1;
}

TEST_F(SharingTest, FairShareStartsTheUserWithLessRecentUsageFirstAndSaysWhy) {
  Make();  // one CPU slot, fair share with the default half-life (24 h)
  const LaunchRequest l = [&] {
    Id(SubmitAs("alice", "earlier"));
    return StartNext();
  }();
  clock_.Advance(3 * kHour);
  Succeed(l);
  const std::string a = Id(SubmitAs("alice", "a")), b = Id(SubmitAs("bob", "b"));
  const Job waiting = Get(a);
  EXPECT_EQ(waiting.queue_position(), 2);
  EXPECT_NE(waiting.message().find("user alice has 3.0 CPU-slot hours in the last 24 h"), std::string::npos)
      << waiting.message();
  EXPECT_NE(waiting.message().find("1 of users with lower recent usage"), std::string::npos) << waiting.message();
  EXPECT_EQ(Get(b).queue_position(), 1);
  // The order holds after a restart (the usage is in the store), and bob starts first.
  Make();
  manager_->Tick();
  ASSERT_EQ(launcher_->Launches(), 1u);
  EXPECT_EQ(launcher_->Last().job_id, b);
}

TEST_F(SharingTest, WithoutFairShareTheQueueKeepsSubmissionOrder) {
  cfg_.quotas.half_life_ms = 0;
  Make();
  Id(SubmitAs("alice", "earlier"));
  const LaunchRequest l = StartNext();
  clock_.Advance(3 * kHour);
  Succeed(l);
  const std::string a = Id(SubmitAs("alice", "a"));
  Id(SubmitAs("bob", "b"));
  manager_->Tick();
  EXPECT_EQ(launcher_->Last().job_id, a);
}


// A job sharing a GPU is charged its predicted share of the GPU's memory for the time it runs, not a
// whole GPU (docs/api.md, "Quotas and fair share"): that is what the GPU-hours limit refuses on and
// what a queued job's message reports. Here each job is predicted a quarter of the GPU.
TEST_F(SharingTest, AJobSharingAGpuIsChargedItsShareOfTheGpuForQuotas) {
  cfg_.gpus = 1;
  cfg_.jobs_per_gpu = 2;
  cfg_.gpu_margin_bytes = 0;
  cfg_.quotas.users["alice"].gpu_hours = 1.0;
  cfg_.quotas.window_ms = 24 * kHour;
  Make();
  auto probe = SubmitAs("alice", "probe", false, /*validate_only=*/true);
  ASSERT_TRUE(probe.ok()) << probe.status();
  const int64_t peak = probe->predicted_peak_bytes();
  ASSERT_GT(peak, 0);
  cfg_.memory.gpu_bytes = peak * 4;
  Make();
  const std::string a = Id(SubmitAs("alice", "a", false)), b = Id(SubmitAs("bob", "b", false));
  manager_->Tick();
  ASSERT_EQ(launcher_->Launches(), 2u);
  EXPECT_EQ(Get(a).slot(), "gpu:0/0");
  EXPECT_EQ(Get(b).slot(), "gpu:0/1");  // the two share GPU 0
  const LaunchRequest la = launcher_->launches[0], lb = launcher_->launches[1];
  ASSERT_TRUE(manager_->Assign(Hello(la)).ok());
  ASSERT_TRUE(manager_->Assign(Hello(lb)).ok());
  clock_.Advance(2 * kHour);
  Succeed(la);
  Succeed(lb);
  // A quarter of a GPU for 2 hours: 0.5 GPU-hours of her 1.0. A whole GPU (2.0) or half of it
  // (1 / --jobs-per-gpu: 1.0) would be at the limit already.
  const std::string next = Id(SubmitAs("alice", "next", false));
  const Job waiting = Get(next);
  EXPECT_NE(waiting.message().find("user alice has 0.5 GPU-hours in the last 24 h"), std::string::npos)
      << waiting.message();
  // Two more hours at a quarter: 1.0, the limit. The usage was written to the store: a restarted
  // daemon counts the same.
  manager_->Tick();
  ASSERT_EQ(launcher_->Launches(), 3u);
  const LaunchRequest ln = launcher_->Last();
  ASSERT_EQ(ln.job_id, next);
  ASSERT_TRUE(manager_->Assign(Hello(ln)).ok());
  clock_.Advance(2 * kHour - 1);
  // Still running: counted up to now (just under 1.0) and not yet refused.
  EXPECT_TRUE(SubmitAs("alice", "probe", false, /*validate_only=*/true).ok());
  clock_.Advance(1);
  Succeed(ln);
  Make();
  auto over = SubmitAs("alice", "over", false);
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_NE(over.status().message().find("user alice has used 1.0 GPU-hours in the last 24 h"), std::string::npos)
      << over.status();
  // Bob's job ran as long on the same GPU, at the same share.
  cfg_.quotas.users["bob"].gpu_hours = 0.5;
  Make();
  auto bob = SubmitAs("bob", "over", false);
  ASSERT_EQ(bob.status().code(), absl::StatusCode::kResourceExhausted) << bob.status();
  EXPECT_NE(bob.status().message().find("user bob has used 0.5 GPU-hours"), std::string::npos) << bob.status();
}

// A job on N GPUs counts N GPUs for its time (docs/api.md), also where --jobs-per-gpu lets jobs share.
TEST_F(SharingTest, AJobOnTwoGpusIsChargedTwoGpus) {
  cfg_.gpus = 2;
  cfg_.jobs_per_gpu = 2;
  cfg_.memory.gpu_bytes = int64_t{80} << 30;
  cfg_.quotas.users["alice"].gpu_hours = 3.0;
  Make();
  Id(SubmitAs("alice", "big", false, false, 2));
  const LaunchRequest l = StartNext();
  ASSERT_EQ(l.ranks, 2);
  clock_.Advance(kHour);
  Succeed(l);
  const std::string next = Id(SubmitAs("alice", "next", false, false, 2));
  manager_->Tick();
  const LaunchRequest l2 = launcher_->Last();
  ASSERT_EQ(l2.job_id, next);
  ASSERT_TRUE(manager_->Assign(Hello(l2)).ok());
  clock_.Advance(kHour / 2);
  Succeed(l2);
  auto over = SubmitAs("alice", "over", false);
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_NE(over.status().message().find("user alice has used 3.0 GPU-hours"), std::string::npos) << over.status();
}

// ---------------------------------------------------------------------------------------------
// Every way a job ends counts once in ftd_job_completions_total{state,outcome} and once in
// ftd_job_run_duration_seconds{state} (docs/metrics.md), whichever path it took there.

class EndingTest : public JobManagerTest {
 protected:
  struct Scrape {
    std::map<std::string, double> completions;               // "state/outcome" -> count
    std::map<std::string, std::pair<double, double>> runs;   // state -> (observations, sum of seconds)
  };
  Scrape Read() {
    Scrape s;
    for (const auto& f : metrics_->registry()->Collect()) {
      for (const auto& m : f.metric) {
        std::map<std::string, std::string> l;
        for (const auto& lp : m.label) l[lp.name] = lp.value;
        if (f.name == "ftd_job_completions_total") s.completions[l["state"] + "/" + l["outcome"]] = m.counter.value;
        if (f.name == "ftd_job_run_duration_seconds") {
          s.runs[l["state"]] = {static_cast<double>(m.histogram.sample_count), m.histogram.sample_sum};
        }
      }
    }
    return s;
  }
  // Since `before`: one completion, in state/outcome, and one run of `seconds` (< 0: any) in state.
  void ExpectOneEnding(const Scrape& before, const std::string& state, const std::string& outcome, double seconds) {
    const Scrape after = Read();
    for (const auto& [key, v] : after.completions) {
      const double was = before.completions.count(key) ? before.completions.at(key) : 0;
      EXPECT_EQ(v - was, key == state + "/" + outcome ? 1 : 0) << "ftd_job_completions_total " << key;
    }
    EXPECT_TRUE(after.completions.count(state + "/" + outcome)) << "no series " << state << "/" << outcome;
    for (const auto& [st, v] : after.runs) {
      const auto was = before.runs.count(st) ? before.runs.at(st) : std::pair<double, double>{0, 0};
      EXPECT_EQ(v.first - was.first, st == state ? 1 : 0) << "ftd_job_run_duration_seconds_count " << st;
      if (st == state && seconds >= 0) {
        EXPECT_DOUBLE_EQ(v.second - was.second, seconds) << st;
      }
    }
    EXPECT_TRUE(after.runs.count(state)) << "no run duration observed for " << state;
  }
};

TEST_F(EndingTest, EachWayOfEndingCountsOneCompletionAndOneRun) {
  auto& m = Make();
  {
    SCOPED_TRACE("succeeded");
    const Scrape before = Read();
    Submit("ok");
    const LaunchRequest l = StartNext();
    clock_.Advance(4000);
    ASSERT_TRUE(Report(l, RunResult::SUCCEEDED, "done").ok());
    launcher_->Exit(l, Exited(0));
    ExpectOneEnding(before, "succeeded", "succeeded", 4.0);
  }
  {
    SCOPED_TRACE("the worker's own failure");
    const Scrape before = Read();
    Submit("error", 0, 3);
    const LaunchRequest l = StartNext();
    clock_.Advance(1500);
    ASSERT_TRUE(Report(l, RunResult::FAILED, "bad data").ok());
    launcher_->Exit(l, Exited(1));
    ExpectOneEnding(before, "failed", "worker_error", 1.5);
  }
  {
    SCOPED_TRACE("an infrastructure failure on the last attempt");
    const Scrape before = Read();
    Submit("sigkill", 0, 1);
    const LaunchRequest l = StartNext();
    clock_.Advance(250);
    launcher_->Exit(l, Signaled(SIGKILL));
    ExpectOneEnding(before, "failed", "killed_by_signal", 0.25);
  }
  {
    SCOPED_TRACE("the worker cannot be started, no attempts left");
    const Scrape before = Read();
    Submit("nospawn", 0, 1);
    launcher_->fail_next = absl::InternalError("cannot start /nonexistent/ftd-worker");
    m.Tick();
    ExpectOneEnding(before, "failed", "spawn_failed", 0);
  }
  {
    SCOPED_TRACE("cancelled while queued");
    const Scrape before = Read();
    const std::string id = Submit("queued");
    ASSERT_TRUE(m.Cancel(id).ok());
    ExpectOneEnding(before, "cancelled", "cancelled", 0);
  }
  {
    SCOPED_TRACE("cancelled while waiting for its retry");
    const Scrape before = Read();
    const std::string id = Submit("flaky", 0, 3);
    const LaunchRequest l = StartNext();
    launcher_->Exit(l, Signaled(SIGKILL));
    ASSERT_EQ(Get(id).state(), ftd::v1::QUEUED);
    ASSERT_TRUE(m.Cancel(id).ok());
    ExpectOneEnding(before, "cancelled", "cancelled", -1);
  }
  {
    SCOPED_TRACE("cancelled while its worker is being launched");
    const Scrape before = Read();
    const std::string id = Submit("starting");
    launcher_->on_launch = [&](const LaunchRequest&) {
      launcher_->on_launch = nullptr;
      EXPECT_TRUE(m.Cancel(id).ok());
    };
    m.Tick();
    clock_.Advance(300);
    launcher_->Exit(launcher_->Last(), Signaled(SIGTERM));
    ExpectOneEnding(before, "cancelled", "cancelled", 0.3);
  }
  {
    SCOPED_TRACE("cancelled while running");
    const Scrape before = Read();
    const std::string id = Submit("running");
    const LaunchRequest l = StartNext();
    ASSERT_TRUE(Step(l, 1).ok());
    clock_.Advance(2500);
    ASSERT_TRUE(m.Cancel(id).ok());
    ASSERT_TRUE(Report(l, RunResult::CANCELLED, "stopped").ok());
    launcher_->Exit(l, Exited(5));
    ExpectOneEnding(before, "cancelled", "cancelled", 2.5);
  }
}

TEST_F(EndingTest, AJobFailedByTheRestartPolicyCountsOneCompletion) {
  for (const bool requeue : {false, true}) {
    SCOPED_TRACE(requeue ? "requeue, no attempts left" : "--restart-policy fail");
    Make();
    Submit("survivor", 0, requeue ? 1 : 3);
    StartNext();
    cfg_.requeue_on_restart = requeue;
    Make();  // a new daemon, with its own counters from 0
    ExpectOneEnding(Scrape{}, "failed", "daemon_restart", -1);
    manager_.reset();
    store_.reset();
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().filename().string().rfind("ftd.db", 0) == 0) fs::remove(e.path());
    }
    OpenStore();
  }
}


// Every per-step series of docs/metrics.md reads the field of the worker's step report it is
// documented to (each field a different value here, so that no two can be swapped unseen), in its
// unit; the counters add what the report adds; an idle slot drops the gauges and reads 0 tokens/s.
TEST_F(EndingTest, EachStepSeriesReadsItsFieldOfTheReportAndGoesWhenTheSlotIsIdle) {
  cfg_.gpus = 1;  // a GPU slot: the CPU slot exports no GPU series (TheCpuSlotExportsNoGpuSeries)
  Make();
  Submit("metered");
  const LaunchRequest l = StartNext();
  auto report = [&](int64_t step, double energy_total) {
    ftd::v1::WorkerMessage m;
    auto* r = m.mutable_step();
    r->set_step(step);
    r->set_total_steps(10);
    r->set_tokens(128);
    r->set_tokens_total(step * 128);
    r->set_loss(2.5);
    r->set_eval_loss(3.25);
    r->set_step_time_s(0.75);
    r->set_tokens_per_s(170.5);
    r->set_mfu(0.41);
    r->set_peak_mem_allocated_bytes(1000);
    r->set_peak_mem_reserved_bytes(2000);
    r->set_peak_rss_bytes(3000);
    r->set_nvml_available(true);
    r->set_energy_total_j(energy_total);
    r->set_power_w(310.0);
    r->set_joules_per_token(0.125);
    r->set_gpu_utilization(0.93);
    r->set_gpu_memory_used_bytes(4000);
    return Send(l, m);
  };
  ASSERT_TRUE(report(2, 50.0).ok());
  ASSERT_TRUE(report(5, 80.0).ok());  // 3 steps, 384 tokens and 30 J more
  const std::map<std::string, std::string> sk = {{"slot", "gpu:0"}, {"kernel_set", "eager"}};
  EXPECT_EQ(Counter("ftd_worker_tokens_per_second", sk), 170.5);
  EXPECT_EQ(Counter("ftd_worker_step_time_seconds", sk), 0.75);
  EXPECT_EQ(Counter("ftd_worker_loss", sk), 2.5);
  EXPECT_EQ(Counter("ftd_worker_eval_loss", sk), 3.25);
  EXPECT_EQ(Counter("ftd_worker_mfu_ratio", sk), 0.41);
  EXPECT_EQ(Counter("ftd_worker_tokens_total", sk), 5 * 128);
  EXPECT_EQ(Counter("ftd_worker_steps_total", sk), 5);
  EXPECT_EQ(Counter("ftd_worker_energy_joules_total", sk), 80.0);
  EXPECT_EQ(Counter("ftd_worker_joules_per_token", sk), 0.125);
  EXPECT_EQ(Counter("ftd_worker_peak_memory_bytes", {{"slot", "gpu:0"}, {"kind", "gpu_allocated"}}), 1000);
  EXPECT_EQ(Counter("ftd_worker_peak_memory_bytes", {{"slot", "gpu:0"}, {"kind", "gpu_reserved"}}), 2000);
  EXPECT_EQ(Counter("ftd_worker_peak_memory_bytes", {{"slot", "gpu:0"}, {"kind", "host_rss"}}), 3000);
  EXPECT_EQ(Counter("ftd_worker_power_watts", {{"slot", "gpu:0"}}), 310.0);
  EXPECT_EQ(Counter("ftd_worker_gpu_utilization_ratio", {{"slot", "gpu:0"}}), 0.93);
  EXPECT_EQ(Counter("ftd_worker_gpu_memory_used_bytes", {{"slot", "gpu:0"}}), 4000);
  ASSERT_TRUE(Report(l, RunResult::SUCCEEDED, "done").ok());
  launcher_->Exit(l, Exited(0));
  EXPECT_EQ(Counter("ftd_worker_tokens_per_second", sk), 0);
  EXPECT_EQ(Counter("ftd_worker_tokens_total", sk), 5 * 128);  // counters stay
  EXPECT_EQ(Counter("ftd_worker_energy_joules_total", sk), 80.0);
  std::set<std::string> left;
  for (const auto& f : metrics_->registry()->Collect()) {
    if (!f.metric.empty()) left.insert(f.name);
  }
  for (const char* gone : {"ftd_worker_step_time_seconds", "ftd_worker_loss", "ftd_worker_eval_loss",
                           "ftd_worker_mfu_ratio", "ftd_worker_peak_memory_bytes", "ftd_worker_power_watts",
                           "ftd_worker_joules_per_token", "ftd_worker_gpu_utilization_ratio",
                           "ftd_worker_gpu_memory_used_bytes"}) {
    EXPECT_FALSE(left.count(gone)) << gone << " stays on an idle slot";
  }
}

// ftd_job_queue_wait_seconds: from submission to the worker's start, and for a retry from the end of
// its backoff (docs/metrics.md), in seconds.
TEST_F(EndingTest, QueueWaitCountsFromSubmissionOrFromTheEndOfTheBackoff) {
  auto& m = Make();
  auto wait = [&]() {
    for (const auto& f : metrics_->registry()->Collect()) {
      if (f.name == "ftd_job_queue_wait_seconds" && !f.metric.empty()) {
        return std::pair<double, double>{static_cast<double>(f.metric[0].histogram.sample_count),
                                         f.metric[0].histogram.sample_sum};
      }
    }
    return std::pair<double, double>{0, 0};
  };
  Submit("waits", 0, 2);
  clock_.Advance(3000);
  const LaunchRequest l = StartNext();
  EXPECT_EQ(wait(), (std::pair<double, double>{1, 3.0}));
  launcher_->Exit(l, Signaled(SIGKILL));  // retried after --backoff-s (1 s here)
  clock_.Advance(cfg_.backoff_base_ms + 500);
  m.Tick();
  ASSERT_EQ(launcher_->Launches(), 2u);
  EXPECT_EQ(wait(), (std::pair<double, double>{2, 3.5}));
}

// A PROFILE job's categories reach ftd_profile_device_seconds_per_step{category,kernel_set} and its
// step total ftd_profile_step_device_seconds, in seconds (the report has milliseconds).
TEST_F(EndingTest, AProfileReachesTheProfileSeriesInSeconds) {
  Make();
  Submit("profiled");
  const LaunchRequest l = StartNext();
  ftd::v1::WorkerMessage msg;
  auto* p = msg.mutable_profile();
  p->set_step_device_ms(250);
  auto* c = p->add_categories();
  c->set_category("matmul");
  c->set_device_ms(120);
  c = p->add_categories();
  c->set_category("attention");
  c->set_device_ms(40);
  ASSERT_TRUE(Send(l, msg).ok());
  EXPECT_EQ(Counter("ftd_profile_device_seconds_per_step", {{"category", "matmul"}, {"kernel_set", "eager"}}), 0.12);
  EXPECT_EQ(Counter("ftd_profile_device_seconds_per_step", {{"category", "attention"}, {"kernel_set", "eager"}}), 0.04);
  EXPECT_EQ(Counter("ftd_profile_step_device_seconds", {{"kernel_set", "eager"}}), 0.25);
}


// ftd_job_retries_total{reason}: each way of being retried counts once under its reason and nothing
// in the completions; ftd_job_submissions_total{kind}: new jobs by kind, not an idempotent retry of a
// submit nor a validate-only one.
TEST_F(EndingTest, RetriesCountByReasonAndSubmissionsByKind) {
  auto& m = Make();
  const Scrape before = Read();
  {
    SCOPED_TRACE("a silent worker");
    const std::string id = Submit("silent", 0, 3);
    const LaunchRequest l = StartNext();
    clock_.Advance(cfg_.heartbeat_timeout_ms);
    m.Tick();
    launcher_->Exit(l, Signaled(SIGKILL));
    ASSERT_EQ(Get(id).state(), ftd::v1::QUEUED);
    EXPECT_EQ(Counter("ftd_job_retries_total", {{"reason", "lost_heartbeat"}}), 1);
    ASSERT_TRUE(m.Cancel(id).ok());
  }
  {
    SCOPED_TRACE("a worker that cannot be started");
    const std::string id = Submit("nospawn", 0, 3);
    launcher_->fail_next = absl::InternalError("cannot start /nonexistent/ftd-worker");
    m.Tick();
    ASSERT_EQ(Get(id).state(), ftd::v1::QUEUED);
    EXPECT_EQ(Counter("ftd_job_retries_total", {{"reason", "spawn_failed"}}), 1);
    ASSERT_TRUE(m.Cancel(id).ok());
  }
  {
    SCOPED_TRACE("a worker that exits without a result");
    const std::string id = Submit("exits", 0, 3);
    launcher_->Exit(StartNext(), Exited(5));
    ASSERT_EQ(Get(id).state(), ftd::v1::QUEUED);
    EXPECT_EQ(Counter("ftd_job_retries_total", {{"reason", "worker_exit"}}), 1);
    ASSERT_TRUE(m.Cancel(id).ok());
  }
  // The three were cancelled while waiting for their retry: three completions, all cancelled.
  const Scrape after = Read();
  double completed = 0;
  for (const auto& [k, v] : after.completions) completed += v - (before.completions.count(k) ? before.completions.at(k) : 0);
  EXPECT_EQ(completed, 3);
  EXPECT_EQ(after.completions.at("cancelled/cancelled") -
                (before.completions.count("cancelled/cancelled") ? before.completions.at("cancelled/cancelled") : 0),
            3);

  const double finetunes = Counter("ftd_job_submissions_total", {{"kind", "finetune"}});
  ftd::v1::SubmitJobRequest req;
  req.set_request_id("r-1");
  req.mutable_spec()->mutable_model()->set_preset("tiny");
  req.mutable_spec()->set_device("cpu");
  ASSERT_TRUE(m.Submit(req).ok());
  ASSERT_TRUE(m.Submit(req).ok());  // the same request again: the same job
  EXPECT_EQ(Counter("ftd_job_submissions_total", {{"kind", "finetune"}}), finetunes + 1);
  ftd::v1::SubmitJobRequest probe = req;
  probe.set_request_id("");
  probe.set_validate_only(true);
  ASSERT_TRUE(m.Submit(probe).ok());
  EXPECT_EQ(Counter("ftd_job_submissions_total", {{"kind", "finetune"}}), finetunes + 1);
  ftd::v1::SubmitJobRequest profile = probe;
  profile.set_validate_only(false);
  profile.set_kind(ftd::v1::PROFILE);
  ASSERT_TRUE(m.Submit(profile).ok());
  EXPECT_EQ(Counter("ftd_job_submissions_total", {{"kind", "profile"}}), 1);
  EXPECT_EQ(Counter("ftd_job_submissions_total", {{"kind", "finetune"}}), finetunes + 1);
}

}  // namespace
}  // namespace ftd::server

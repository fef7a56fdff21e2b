// ProcessLauncher with real processes and an injected cgroup reader: the exit it reports says
// whether the kernel's OOM killer ended the worker.
#include "server/executors/local/worker_launcher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>

namespace ftd::server {
namespace {

namespace fs = std::filesystem;

// Records what it is asked and reports `oom_kills` for every cgroup.
class FakeCgroups final : public WorkerCgroups {
 public:
  absl::Status Place(const std::string& name, pid_t pid) override {
    std::lock_guard<std::mutex> l(mu);
    placed.emplace_back(name, pid);
    return place_error;
  }
  CgroupMemory Release(const std::string& name) override {
    std::lock_guard<std::mutex> l(mu);
    released.push_back(name);
    return {oom_kills, int64_t{70} << 20, int64_t{64} << 20};
  }
  int64_t limit_bytes() const override { return int64_t{64} << 20; }
  std::string Describe() const override { return "fake"; }

  std::mutex mu;
  absl::Status place_error = absl::OkStatus();
  int64_t oom_kills = 0;
  std::vector<std::pair<std::string, pid_t>> placed;
  std::vector<std::string> released;
};

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ftd-launcher-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // A "worker" that dies of SIGKILL at once, as one the OOM killer picked would.
    worker_ = dir_ + "/worker.sh";
    std::ofstream(worker_) << "#!/bin/sh\nkill -9 $$\n";
    ::chmod(worker_.c_str(), 0755);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // Runs one attempt through a launcher over `cgroups`; returns how it ended.
  ExitStatus RunOne(WorkerCgroups* cgroups, const LaunchRequest& req = {"j-000001", 2, "token", "cpu", -1, {}, {}, 1},
                    std::optional<WorkerUser> user = std::nullopt) {
    ProcessLauncher launcher({worker_, "unix:/nonexistent", dir_ + "/jobs", cgroups, std::move(user)});
    std::mutex mu;
    std::condition_variable cv;
    std::optional<ExitStatus> got;
    launcher.SetExitHandler([&](const std::string& job, int attempt, ExitStatus st) {
      EXPECT_EQ(job, "j-000001");
      EXPECT_EQ(attempt, 2);
      std::lock_guard<std::mutex> l(mu);
      got = st;
      cv.notify_all();
    });
    auto pid = launcher.Launch(req);
    EXPECT_TRUE(pid.ok()) << pid.status();
    std::unique_lock<std::mutex> l(mu);
    EXPECT_TRUE(cv.wait_for(l, std::chrono::seconds(10), [&] { return got.has_value(); }));
    l.unlock();
    launcher.SetExitHandler(nullptr);
    return got.value_or(ExitStatus{});
  }
  std::string dir_, worker_;
};

TEST_F(LauncherTest, AnOomKillCountedInTheWorkersCgroupMarksItsExit) {
  FakeCgroups cg;
  cg.oom_kills = 1;
  const ExitStatus st = RunOne(&cg);
  EXPECT_TRUE(st.signaled);
  EXPECT_EQ(st.signal, SIGKILL);
  EXPECT_TRUE(st.oom_killed);
  EXPECT_EQ(st.memory_limit_bytes, int64_t{64} << 20);
  EXPECT_EQ(st.memory_peak_bytes, int64_t{70} << 20);
  ASSERT_EQ(cg.placed.size(), 1u);
  EXPECT_EQ(cg.placed[0].first, "j-000001-2");
  EXPECT_EQ(cg.released, std::vector<std::string>{"j-000001-2"});
}

TEST_F(LauncherTest, ASigkillWithoutAnOomKillIsJustASignal) {
  FakeCgroups cg;
  const ExitStatus st = RunOne(&cg);
  EXPECT_TRUE(st.signaled);
  EXPECT_FALSE(st.oom_killed);
  EXPECT_EQ(cg.released.size(), 1u);
}

TEST_F(LauncherTest, AWorkerRunsEvenWhereItsCgroupCannotBeMade) {
  FakeCgroups cg;
  cg.place_error = absl::FailedPreconditionError("no cgroup");
  cg.oom_kills = 1;
  const ExitStatus st = RunOne(&cg);
  EXPECT_TRUE(st.signaled);
  EXPECT_FALSE(st.oom_killed) << "a cgroup it was never in says nothing of it";
  EXPECT_TRUE(cg.released.empty());
}

TEST_F(LauncherTest, WithoutCgroupsASigkillIsOomOnlyIfTheKernelCountedOne) {
  const int64_t before = SystemOomKills();
  const ExitStatus st = RunOne(nullptr);
  EXPECT_TRUE(st.signaled);
  EXPECT_EQ(st.oom_killed, SystemOomKills() > before && before >= 0);
}

TEST_F(LauncherTest, ARankThatFailsStopsEveryRankAndTheAttemptEndsAsItDid) {
  // Rank 1 fails after a moment; rank 0 would run for a minute. Both note their arguments and the
  // variables ftd must set.
  std::ofstream(worker_) << "#!/bin/sh\n"
                         << "echo \"$* $CUDA_VISIBLE_DEVICES $NCCL_NVLS_ENABLE $TORCH_SYMM_MEM_DISABLE_MULTICAST "
                         << "$NVSHMEM_DISABLE_NVLS\" > " << dir_ << "/rank.$$\n"
                         << "case \"$*\" in *'--rank 1'*) sleep 0.3; exit 3;; esac\nexec sleep 60\n";
  FakeCgroups cg;
  const auto t0 = std::chrono::steady_clock::now();
  const ExitStatus st = RunOne(&cg, {"j-000001", 2, "token", "gpu:3", 3, {"gpu:5"}, {5}, 2});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "rank 0 was left running";
  EXPECT_FALSE(st.signaled);
  EXPECT_EQ(st.code, 3);  // the rank that failed, not rank 0's SIGKILL
  ASSERT_EQ(cg.placed.size(), 2u);  // both ranks in the attempt's cgroup, released once
  EXPECT_EQ(cg.placed[1].first, "j-000001-2");
  EXPECT_EQ(cg.released, std::vector<std::string>{"j-000001-2"});
  std::vector<std::string> lines;
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (e.path().filename().string().rfind("rank.", 0) != 0) continue;
    std::ifstream in(e.path());
    std::string line;
    std::getline(in, line);
    lines.push_back(line);
  }
  std::sort(lines.begin(), lines.end());
  const std::string store = dir_ + "/jobs/j-000001/rendezvous-2.store";
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("--rank 0 --store " + store + " 3,5 0 1 1"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("--rank 1 --store " + store + " 3,5 0 1 1"), std::string::npos) << lines[1];
}

// A daemon at its descriptor limit cannot make the pipe a start needs: RESOURCE_EXHAUSTED, which the
// job manager does not count against the job (exit_classification.h), not a spawn failure. Here the
// test process itself has every descriptor below its limit taken.
TEST_F(LauncherTest, AStartTheDaemonHasNoDescriptorsForIsResourceExhausted) {
  ProcessLauncher launcher({worker_, "unix:/nonexistent", dir_ + "/jobs", nullptr, std::nullopt});
  launcher.SetExitHandler([](const std::string&, int, ExitStatus) {});
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit tight = old;
  tight.rlim_cur = 256;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  // Every descriptor below the limit taken, as a flood of connections would take them.
  std::vector<int> fillers;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fillers.push_back(fd);
  ASSERT_EQ(errno, EMFILE);
  auto pid = launcher.Launch({"j-000001", 1, "token", "cpu", -1, {}, {}, 1});
  for (int fd : fillers) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  ASSERT_FALSE(pid.ok());
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kResourceExhausted) << pid.status();
  EXPECT_NE(pid.status().message().find("Too many open files"), std::string::npos) << pid.status();
  // With room again, the same launch starts.
  auto again = launcher.Launch({"j-000001", 2, "token", "cpu", -1, {}, {}, 1});
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST(WorkerUserTest, AnUnknownUserOrRootIsRefusedAndSoIsADaemonThatCannotSwitch) {
  if (::geteuid() != 0) {
    auto u = LookUpWorkerUser("nobody");
    ASSERT_FALSE(u.ok());
    EXPECT_EQ(u.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(u.status().message().find("needs ftd to run as root"), std::string::npos) << u.status();
    return;
  }
  auto missing = LookUpWorkerUser("ftd-no-such-user");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--worker-user ftd-no-such-user: no such user"), std::string::npos)
      << missing.status();
  auto root = LookUpWorkerUser("root");
  ASSERT_FALSE(root.ok());
  EXPECT_NE(root.status().message().find("is root"), std::string::npos) << root.status();
}

// As root: the worker runs as the worker user, its job directory (a staged checkpoint in it
// included) is given to that user first, and a link planted there is not followed.
TEST_F(LauncherTest, AWorkerUsersWorkerRunsAsItInADirectoryGivenToIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "switching users needs root (CI runs as root)";
  auto user = LookUpWorkerUser("nobody");
  ASSERT_TRUE(user.ok()) << user.status();
  ASSERT_EQ(::chmod(dir_.c_str(), 0711), 0);  // mkdtemp's 0700 would stop the worker on its way in
  const fs::path job = fs::path(dir_) / "jobs" / "j-000001";
  fs::create_directories(job / "checkpoints" / "step-1");
  std::ofstream(job / "checkpoints" / "step-1" / "model.safetensors") << "x";
  const std::string secret = dir_ + "/secret";
  std::ofstream(secret) << "root only";
  ::chmod(secret.c_str(), 0600);
  fs::create_symlink(secret, job / "link");
  std::ofstream(worker_) << "#!/bin/sh\nd=" << job.string()
                         << "\nid -u > $d/ids; id -G >> $d/ids; echo \"$HOME\" >> $d/ids\n"
                            "cat " << secret << " > $d/read 2>&1 || echo refused >> $d/read\n"
                            "touch $d/checkpoints/step-1/new\n";
  const ExitStatus got = RunOne(nullptr, {"j-000001", 2, "token", "cpu", -1, {}, {}, 1}, *user);
  EXPECT_FALSE(got.signaled);
  EXPECT_EQ(got.code, 0);
  std::ifstream ids(job / "ids");
  std::string uid, groups, home;
  std::getline(ids, uid);
  std::getline(ids, groups);
  std::getline(ids, home);
  EXPECT_EQ(uid, std::to_string(user->uid));
  std::istringstream gids(groups);
  for (std::string g; gids >> g;) EXPECT_NE(g, "0") << "root's group kept: " << groups;
  EXPECT_EQ(home, user->home);
  std::ifstream read(job / "read");
  std::string first;
  std::getline(read, first);
  EXPECT_NE(first, "root only") << "the worker read a root-only file";
  struct stat st {};
  for (const fs::path& p : {job, job / "checkpoints" / "step-1" / "model.safetensors", job / "checkpoints" / "step-1" / "new"}) {
    ASSERT_EQ(::stat(p.c_str(), &st), 0) << p;
    EXPECT_EQ(st.st_uid, user->uid) << p;
  }
  ASSERT_EQ(::stat(secret.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u) << "the link's target was given away";
}

}  // namespace
}  // namespace ftd::server

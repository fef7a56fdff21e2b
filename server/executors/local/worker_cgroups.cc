#include "server/executors/local/worker_cgroups.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "spec/bytes.h"

namespace ftd::server {
namespace fs = std::filesystem;

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return absl::FailedPreconditionError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size())) {
    return absl::FailedPreconditionError(absl::StrCat("cannot write \"", text, "\" to ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

// "key value" lines (memory.events, memory.oom_control, /proc/vmstat): the value of `key`, or -1.
int64_t Field(const std::string& text, std::string_view key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> kv = absl::StrSplit(line, ' ');
    int64_t v = 0;
    if (kv.size() == 2 && kv[0] == absl::string_view(key.data(), key.size()) && absl::SimpleAtoi(kv[1], &v)) return v;
  }
  return -1;
}

int64_t Number(const std::string& text) {
  int64_t v = 0;
  return absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &v) ? v : 0;
}

std::string Bytes(int64_t b) { return ftd::spec::FormatBytes(static_cast<double>(b)); }

class CgroupFs final : public WorkerCgroups {
 public:
  CgroupFs(bool v2, std::string parent, int64_t limit, bool remove_parent)
      : v2_(v2), parent_(std::move(parent)), limit_(limit), remove_parent_(remove_parent) {}
  ~CgroupFs() override {
    if (remove_parent_) ::rmdir(parent_.c_str());
  }

  absl::Status Place(const std::string& name, pid_t pid) override {
    const std::string dir = parent_ + "/" + name;
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(absl::StrCat("cannot create cgroup ", dir, ": ", std::strerror(errno)));
    }
    auto st = WriteFile(dir + (v2_ ? "/memory.max" : "/memory.limit_in_bytes"), absl::StrCat(limit_));
    // Without swap in the limit a job would swap instead of meeting it.
    if (st.ok() && v2_) (void)WriteFile(dir + "/memory.swap.max", "0");
    if (st.ok() && !v2_) (void)WriteFile(dir + "/memory.memsw.limit_in_bytes", absl::StrCat(limit_));
    if (st.ok()) st = WriteFile(dir + "/cgroup.procs", absl::StrCat(pid));
    if (!st.ok()) ::rmdir(dir.c_str());
    return st;
  }

  CgroupMemory Release(const std::string& name) override {
    const std::string dir = parent_ + "/" + name;
    CgroupMemory m;
    m.limit_bytes = limit_;
    if (v2_) {
      m.oom_kills = Field(ReadFile(dir + "/memory.events"), "oom_kill");
      m.peak_bytes = Number(ReadFile(dir + "/memory.peak"));  // Linux 5.19+
    } else {
      m.oom_kills = Field(ReadFile(dir + "/memory.oom_control"), "oom_kill");
      m.peak_bytes = Number(ReadFile(dir + "/memory.max_usage_in_bytes"));
    }
    m.oom_kills = std::max<int64_t>(m.oom_kills, 0);
    // The reaped worker's group was killed; the kernel may take a moment to let its last task go.
    for (int i = 0; i < 100 && ::rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return m;
  }

  int64_t limit_bytes() const override { return limit_; }
  std::string Describe() const override {
    return absl::StrCat("cgroup ", v2_ ? "v2" : "v1 (memory controller)", " under ", parent_, ", ",
                        v2_ ? "memory.max " : "memory.limit_in_bytes ", Bytes(limit_), " per worker");
  }

 private:
  const bool v2_;
  const std::string parent_;
  const int64_t limit_;
  const bool remove_parent_;
};

// The daemon's own cgroup path in the v2 hierarchy ("0::/x") or v1's memory one ("4:memory:/x").
std::string OwnCgroup(bool v2) {
  for (absl::string_view line : absl::StrSplit(ReadFile("/proc/self/cgroup"), '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (v2 && f[0] == "0" && f[1].empty()) return std::string(f[2]);
    if (!v2) {
      for (absl::string_view c : absl::StrSplit(f[1], ',')) {
        if (c == "memory") return std::string(f[2]);
      }
    }
  }
  return "";
}

// Where the v2 hierarchy, or v1's memory controller, is mounted ("" if nowhere).
std::string MountPoint(bool v2) {
  for (absl::string_view line : absl::StrSplit(ReadFile("/proc/self/mountinfo"), '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    size_t dash = 0;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (dash < 5 || dash + 3 >= f.size()) continue;
    const absl::string_view type = f[dash + 1], opts = f[dash + 3];
    if (v2 && type == "cgroup2") return std::string(f[4]);
    if (!v2 && type == "cgroup") {
      for (absl::string_view o : absl::StrSplit(opts, ',')) {
        if (o == "memory") return std::string(f[4]);
      }
    }
  }
  return "";
}

bool HasMemoryController(const std::string& dir) {
  for (absl::string_view c : absl::StrSplit(ReadFile(dir + "/cgroup.controllers"), absl::ByAnyChar(" \n"))) {
    if (c == "memory") return true;
  }
  return false;
}

// v2: `dir`'s children get the memory controller (its parent must offer it).
absl::Status EnableMemoryForChildren(const std::string& dir) {
  if (!HasMemoryController(dir)) {
    (void)WriteFile(fs::path(dir).parent_path().string() + "/cgroup.subtree_control", "+memory");
    if (!HasMemoryController(dir)) {
      return absl::FailedPreconditionError(absl::StrCat("the memory controller is not available in ", dir,
                                                        " (its parent's cgroup.subtree_control lacks it)"));
    }
  }
  return WriteFile(dir + "/cgroup.subtree_control", "+memory");
}

absl::StatusOr<std::unique_ptr<WorkerCgroups>> Auto(int64_t limit) {
  // v2, where the daemon's cgroup holds the daemon alone (systemd's Delegate=yes): the daemon moves
  // into a leaf of its own and workers go beside it (a cgroup with processes cannot enable controllers).
  std::string why;
  if (const std::string mount = MountPoint(true); !mount.empty()) {
    const std::string own = mount + OwnCgroup(true);
    const std::string procs = ReadFile(own + "/cgroup.procs");
    if (Number(procs) == ::getpid() && absl::StripAsciiWhitespace(procs) == absl::StrCat(::getpid())) {
      const std::string leaf = own + "/ftd-daemon";
      ::mkdir(leaf.c_str(), 0755);
      auto st = WriteFile(leaf + "/cgroup.procs", absl::StrCat(::getpid()));
      if (st.ok()) st = EnableMemoryForChildren(own);
      if (st.ok()) return std::unique_ptr<WorkerCgroups>(new CgroupFs(true, own, limit, false));
      why = absl::StrCat("cgroup v2: ", st.message());
    } else {
      why = absl::StrCat("cgroup v2: ftd's cgroup ", own, " holds other processes (run it as a systemd service "
                         "with Delegate=yes, or pass --worker-cgroup)");
    }
  } else {
    why = "no cgroup v2 mount";
  }
  // v1's memory controller (hybrid hosts): a cgroup per daemon under the daemon's own.
  if (const std::string mount = MountPoint(false); !mount.empty()) {
    const std::string own = mount + OwnCgroup(false);
    // Parents that daemons killed before they could remove them, if empty.
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(own, ec)) {
      const std::string n = e.path().filename().string();
      int pid = 0;
      if (n.rfind("ftd-", 0) == 0 && absl::SimpleAtoi(n.substr(4), &pid) && ::kill(pid, 0) != 0 && errno == ESRCH) {
        for (const auto& w : fs::directory_iterator(e.path(), ec)) {
          if (w.is_directory(ec)) ::rmdir(w.path().c_str());  // workers' cgroups, if they are empty
        }
        ::rmdir(e.path().c_str());
      }
    }
    const std::string parent = absl::StrCat(own, "/ftd-", ::getpid());
    if (::mkdir(parent.c_str(), 0755) == 0 || errno == EEXIST) {
      return std::unique_ptr<WorkerCgroups>(new CgroupFs(false, parent, limit, true));
    }
    absl::StrAppend(&why, "; cgroup v1: cannot create ", parent, ": ", std::strerror(errno));
  }
  return absl::FailedPreconditionError(why);
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerCgroups>> OpenWorkerCgroups(const std::string& parent, int64_t limit_bytes) {
  if (limit_bytes <= 0) return absl::InvalidArgumentError("the workers' memory limit is unknown");
  if (parent == "auto") return Auto(limit_bytes);
  std::error_code ec;
  fs::create_directories(parent, ec);
  struct statfs sfs {};
  if (ec || ::statfs(parent.c_str(), &sfs) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create the cgroup ", parent, ": ",
                                                      ec ? ec.message() : std::strerror(errno)));
  }
  if (sfs.f_type == CGROUP2_SUPER_MAGIC) {
    if (auto st = EnableMemoryForChildren(parent); !st.ok()) return st;
    return std::unique_ptr<WorkerCgroups>(new CgroupFs(true, parent, limit_bytes, false));
  }
  if (sfs.f_type == CGROUP_SUPER_MAGIC && fs::exists(parent + "/memory.limit_in_bytes")) {
    return std::unique_ptr<WorkerCgroups>(new CgroupFs(false, parent, limit_bytes, false));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(parent, " is not in a cgroup v2 hierarchy nor in cgroup v1's memory controller"));
}

int64_t SystemOomKills() { return Field(ReadFile("/proc/vmstat"), "oom_kill"); }

}  // namespace ftd::server

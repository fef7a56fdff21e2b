// ftctl prepare SPEC|- [--set field=value]... [--worker PATH]: tokenizes the spec's JSONL dataset
// (and its held-out file) into the prepared-dataset cache on this machine with `ftd-worker prepare`,
// so that jobs on the same data, tokenizer and options start training at once (docs/data-format.md).
// Relative paths are the caller's, as for submit. Exit status: ftd-worker prepare's (0 prepared or
// found, 1 failed, 2 a spec or data error), 64 for a usage error.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/shared_flags.h"
#include "client/spec_input.h"
#include "spec/paths.h"
#include "spec/spec.h"

extern char** environ;

namespace ftd::client {

namespace {

namespace fs = std::filesystem;

struct PrepareFlags {
  std::string spec_path, worker;
  std::vector<std::string> sets;
};

// --worker, else $FTD_WORKER, else ftd-worker beside ftctl (an install) or in the build tree beside
// client/, else "ftd-worker" looked up on PATH.
std::string FindWorker(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("FTD_WORKER"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const fs::path& p : {self.parent_path() / "ftd-worker", self.parent_path().parent_path() / "worker" / "ftd-worker"}) {
      if (::access(p.c_str(), X_OK) == 0) return p.string();
    }
  }
  return "ftd-worker";
}

int RunPrepare(const PrepareFlags& f) {
  auto spec = ReadSpec(f.spec_path, std::cin);
  if (!spec.ok()) return Usage(std::string(spec.status().message()));
  for (const auto& kv : f.sets) {
    if (auto st = ftd::spec::ApplySetOverride(kv, &*spec); !st.ok()) return Usage(std::string(st.message()));
  }
  std::error_code ec;
  const auto cwd = fs::current_path(ec);
  if (ec) return Usage(absl::StrCat("cannot resolve the spec's relative paths: no current directory (", ec.message(), ")"));
  if (auto st = ftd::spec::ResolveSpecPaths(cwd.string(), &*spec); !st.ok()) return Fail(st);

  // The resolved spec goes to ftd-worker as a file of its own.
  const char* tmp = std::getenv("TMPDIR");
  std::string path = (fs::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") / "ftctl-prepare-XXXXXX.json").string();
  const int fd = ::mkstemps(path.data(), 5);
  if (fd < 0) return Fail(absl::InternalError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno))));
  ::close(fd);
  struct Remove {
    std::string p;
    ~Remove() { ::unlink(p.c_str()); }
  } remove{path};
  {
    std::ofstream out(path);
    out << ftd::spec::TrainSpecToJson(*spec) << "\n";
    if (!out) return Fail(absl::InternalError(absl::StrCat("cannot write ", path)));
  }

  const std::string worker = FindWorker(f.worker);
  std::vector<std::string> args = {worker, "prepare", path};
  if (isatty(STDERR_FILENO) == 0) args.push_back("--no-progress");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // ftctl blocks SIGINT/SIGTERM for its interrupt thread; the worker gets the default mask, so Ctrl-C
  // (sent to the whole foreground group) stops it.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, worker.c_str(), nullptr, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return Fail(absl::NotFoundError(absl::StrCat("cannot run ", worker, ": ", std::strerror(rc),
                                                 " (give --worker PATH or $FTD_WORKER, or put ftd-worker on PATH)")));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  std::cerr << "ftctl: " << worker << " prepare was killed by signal " << WTERMSIG(status) << std::endl;
  return kExitInterrupted;
}

}  // namespace

Command AddPrepare(CLI::App& app) {
  auto f = std::make_shared<PrepareFlags>();
  auto* c = app.add_subcommand("prepare",
                               "Tokenize a spec's JSONL dataset into the prepared-dataset cache here, once, for the jobs "
                               "that use it (runs ftd-worker prepare)");
  c->add_option("spec", f->spec_path, "TrainSpec file, JSON or YAML, or - for stdin (docs/job-spec.md)")
      ->required()
      ->type_name("FILE");
  AddSetFlag(c, &f->sets, "--set data.cache_dir=/data/cache");
  c->add_option("--worker", f->worker, "the ftd-worker to run (default: $FTD_WORKER, the one beside ftctl, PATH)")
      ->type_name("FILE");
  return {c, [f](Context&) { return RunPrepare(*f); }};
}

}  // namespace ftd::client

// A job's outputs as clients read them: its event log watched (Watch::Next waits on the event hub,
// never polls), its log file (the worker's output and the daemon's lines, AppendToLog) and a PROFILE
// job's trace.
#include "server/jobs/job_manager.h"

#include <fcntl.h>
#include <unistd.h>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "server/jobs/job_events.h"
#include "server/requests/request_limits.h"

namespace ftd::server {
namespace fs = std::filesystem;
using ftd::v1::Job;
using ftd::v1::JobEvent;
using ftd::v1::RunResult;

absl::StatusOr<JobManager::LogFile> JobManager::Log(const std::string& id) {
  auto job = store_->Get(id);
  if (!job.ok()) return job.status();
  return LogFile{(fs::path(JobDir(id)) / "worker.log").string(), IsTerminal(job->state())};
}

void JobManager::AppendToLog(const std::string& id, const std::string& line) const {
  std::error_code ec;
  fs::create_directories(JobDir(id), ec);
  // Never through a link: the job's directory may belong to the workers' user (--worker-user).
  const std::string path = (fs::path(JobDir(id)) / "worker.log").string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  const std::string text = line + '\n';
  (void)!::write(fd, text.data(), text.size());
  ::close(fd);
}

JobManager::Watch::Watch(JobManager* m, std::string id, int64_t after_seq)
    : m_(m), id_(std::move(id)), after_(after_seq), sub_(m->hub_.Subscribe(id_)) {}

absl::StatusOr<std::unique_ptr<JobManager::Watch>> JobManager::WatchJob(const std::string& id, int64_t after_seq) {
  if (after_seq < 0) return absl::InvalidArgumentError("after_seq must be >= 0");
  return std::unique_ptr<Watch>(new Watch(this, id, after_seq));
}

absl::StatusOr<std::vector<JobEvent>> JobManager::Watch::Next(std::chrono::milliseconds max_wait, bool* done) {
  constexpr int kLimit = kMaxEventsPerRead;
  const auto deadline = std::chrono::steady_clock::now() + max_wait;
  *done = false;
  for (;;) {
    if (reread_) {
      auto job = m_->store_->Get(id_);  // state first: every event of a terminal job is already stored
      if (!job.ok()) return job.status();
      auto events = m_->store_->Events(id_, after_, kLimit);
      if (!events.ok()) return events.status();
      *done = IsTerminal(job->state()) && events->size() < static_cast<size_t>(kLimit);
      if (!events->empty() || *done) {
        if (!events->empty()) after_ = events->back().seq();
        return events;
      }
      reread_ = false;
    }
    if (!sub_->WaitForNew(deadline)) return std::vector<JobEvent>();
    reread_ = true;
  }
}

absl::StatusOr<std::string> JobManager::TracePath(const std::string& id) {
  auto job = store_->Get(id);
  if (!job.ok()) return job.status();
  if (job->kind() != ftd::v1::PROFILE) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " is a ", ftd::v1::JobKind_Name(job->kind()),
                                                      " job; only PROFILE jobs have a trace (ftctl submit --kind profile)"));
  }
  const std::string path = (fs::path(JobDir(id)) / "trace.json").string();
  std::error_code ec;
  if (!job->has_profile() || !fs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("job ", id, " has no trace yet (", ftd::v1::JobState_Name(job->state()),
                                            "); it is written once the profiled steps ran"));
  }
  return path;
}

}  // namespace ftd::server

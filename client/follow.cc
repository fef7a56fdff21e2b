#include "client/follow.h"

#include <unistd.h>

#include <iostream>

#include "client/context.h"
#include "client/render.h"

namespace ftd::client {

int Follow(JobClient& client, const std::string& id, FollowOutput output) {
  ftd::v1::JobState final_state = ftd::v1::JOB_STATE_UNSPECIFIED;
  bool reconnecting = false;
  const bool live = isatty(STDOUT_FILENO) != 0;  // not a terminal (a file, a pipe): one line per event
  bool live_line = false;
  auto st = client.Watch(
      id, 0,
      [&](const ftd::v1::JobEvent& e) {
        if (e.has_state()) final_state = e.state().state();
        if (output == FollowOutput::kNone) return;
        if (output == FollowOutput::kJson) {
          std::cout << ToJson(e, false) << std::endl;
        } else if (live && e.has_step() && !e.step().has_eval_loss()) {
          // On a terminal the step line is one live line, rewritten in place: it must fit the width,
          // as a wrapped line would leave its first part behind at each rewrite. A step with a
          // held-out loss stays, as a line of its own.
          std::cout << "\r\x1b[K" << LiveStepLine(e.step(), TerminalColumns(STDOUT_FILENO)) << std::flush;
          live_line = true;
        } else {
          // The live line stays above other events; a step with a held-out loss takes its place.
          if (live_line) std::cout << (e.has_step() ? "\r\x1b[K" : "\n");
          live_line = false;
          std::cout << EventLine(e) << std::endl;
        }
      },
      [&](ConnectionEvent c, const std::string& why) {
        if (c == ConnectionEvent::kLost && !reconnecting) {
          std::cerr << "ftctl: lost the connection to ftd (" << why << "); reconnecting for up to "
                    << client.options().timeout.count() / 1000.0 << " s" << std::endl;
          reconnecting = true;
        } else if (c == ConnectionEvent::kRestored && reconnecting) {
          std::cerr << "ftctl: reconnected" << std::endl;
          reconnecting = false;
        }
      });
  if (live_line) std::cout << std::endl;
  if (Interrupted()) {
    std::cerr << "ftctl: stopped watching " << id << "; the job goes on" << std::endl;
    return kExitInterrupted;
  }
  if (!st.ok()) return Fail(st);
  if (final_state == ftd::v1::JOB_STATE_UNSPECIFIED) {
    auto job = client.Get(id);
    if (!job.ok()) return Fail(job.status());
    final_state = job->state();
  }
  return ExitCodeForState(final_state);
}

void PrintOutcome(JobClient& client, const std::string& id, int rc, std::ostream& out) {
  if (rc > kExitJobCancelled) return;
  auto job = client.Get(id);
  if (job.ok()) {
    out << Shown(job->id()) << " " << ftd::v1::JobState_Name(job->state()) << ": " << Shown(job->message())
        << std::endl;
  }
}

int Submitted(JobClient& client, const absl::StatusOr<ftd::v1::SubmitJobResponse>& resp, bool wait) {
  if (!resp.ok()) return Fail(resp.status());
  std::cout << Shown(resp->job().id()) << std::endl;
  if (!resp->created()) std::cerr << "ftctl: request id already used: this is the existing job" << std::endl;
  if (!wait) return kExitOk;
  const int rc = Follow(client, resp->job().id(), FollowOutput::kNone);
  PrintOutcome(client, resp->job().id(), rc, std::cerr);
  return rc;
}

}  // namespace ftd::client

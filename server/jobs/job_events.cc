#include "server/jobs/job_events.h"

#include "server/store/store.h"

namespace ftd::server {

void AppendStateEvents(const ftd::v1::Job& job, std::vector<ftd::v1::JobEvent>* events) {
  ftd::v1::JobEvent state;
  *state.mutable_state() = job;
  events->push_back(std::move(state));
  if (IsTerminal(job.state())) {
    ftd::v1::JobEvent result;
    *result.mutable_result() = job.result();
    events->push_back(std::move(result));
  }
}

}  // namespace ftd::server

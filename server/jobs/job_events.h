// The one rule for what a state change writes to a job's event log: the job as it is after the
// change (a state event), then, when the change made it terminal, its result (the event after which
// a watch ends).
#pragma once

#include <vector>

#include "ftd/v1/jobs.pb.h"

namespace ftd::server {

void AppendStateEvents(const ftd::v1::Job& job, std::vector<ftd::v1::JobEvent>* events);

}  // namespace ftd::server

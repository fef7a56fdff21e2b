// Whether a submit that reuses a request_id asks for the job that id already names. A retried
// submit (the answer was lost) repeats its request exactly and gets the same job back; the same id
// with a different request is a client's mistake, refused with the fields that differ.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ftd/v1/jobs.pb.h"

namespace ftd::server {

// The fields a submit decides (kind, name, owner, priority, max_attempts and every spec field) that
// differ between `existing` and `requested`, as paths ("name", "spec.optimizer.lr"), in field order.
std::vector<std::string> DifferingRequestFields(const ftd::v1::Job& existing, const ftd::v1::Job& requested);

// OK when `requested` is what `existing` was submitted as; otherwise ALREADY_EXISTS naming the job,
// the request id and the differing fields.
absl::Status CheckSameRequest(const ftd::v1::Job& existing, const ftd::v1::Job& requested);

}  // namespace ftd::server

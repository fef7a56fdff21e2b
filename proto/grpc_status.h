// The one map between ftd's internal errors (absl::Status) and gRPC statuses, both directions: the
// daemon's handlers answer with ToGrpc, ftctl reads answers with FromGrpc. The message (which names
// the field and the fix) passes through unchanged.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace ftd {

grpc::Status ToGrpc(const absl::Status& s);
absl::Status FromGrpc(const grpc::Status& s);

}  // namespace ftd

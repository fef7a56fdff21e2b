// Checks of a protobuf message that came from outside (a gRPC request, a spec file) that its
// parser lets through: fields this build does not know (a newer client's, or stray bytes), enum
// values outside their enum (proto3 keeps them as numbers), NaN or infinite floats and doubles, and
// text fields holding control characters (spec/text.h: a NUL in a path, a newline or an escape
// sequence in a name).
// Generic over every field, so a field added to the protos later is covered without a new check.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace ftd::spec {

// INVALID_ARGUMENT naming the first offending field by its path below `root` ("spec" gives
// "spec.optimizer.eps"; "" gives "kind").
absl::Status CheckMessage(const google::protobuf::Message& m, std::string_view root);

}  // namespace ftd::spec

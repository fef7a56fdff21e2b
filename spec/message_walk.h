// One walk over a protobuf message by reflection, for the checks that must cover every field,
// including fields added to the protos later (spec/message_check.h, server/requests/request_limits.h).
// Visits the set fields of a message and of every message below it, depth-first in field-number
// order, each with its path below `root`: "spec.optimizer.eps", "spec.lora.target_modules[1]".
// A map entry's key and value are named after the map: "spec.kernels key", "spec.kernels value".
// The first non-OK status a visitor returns ends the walk and is returned.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace ftd::spec {

class MessageVisitor {
 public:
  virtual ~MessageVisitor() = default;
  // Each message reached (the root first, map entries too), before its fields. `path` is "" for a
  // root named "".
  virtual absl::Status OnMessage(const google::protobuf::Message& m, const std::string& path) {
    return absl::OkStatus();
  }
  // Each set field of `m`, before its values; false skips the field's values (and what is below them).
  virtual absl::StatusOr<bool> OnField(const google::protobuf::Message& m, const google::protobuf::FieldDescriptor* f,
                                       const std::string& path) {
    return true;
  }
  // Each value that is not a message: element `index` of a repeated field, or -1.
  virtual absl::Status OnValue(const google::protobuf::Message& m, const google::protobuf::FieldDescriptor* f,
                               int index, const std::string& path) {
    return absl::OkStatus();
  }
};

absl::Status WalkMessage(const google::protobuf::Message& m, const std::string& root, MessageVisitor& visitor);

}  // namespace ftd::spec

// Protobuf messages as JSON for people and scripts: proto3 JSON with the .proto field names, in
// field order, and 64-bit integers as JSON numbers (proto3 JSON writes them as strings: "steps":
// "300"). ftctl's -o json, ftd-worker's output and the specs both print (`ftd-worker default-spec`,
// `ftctl get --spec`) all come from here, so every one of them prints numbers.
#pragma once

#include <string>

#include "google/protobuf/message.h"
#include "nlohmann/json.hpp"

namespace ftd::spec {

// `every_field`: every scalar present, also at its default (stable keys for scripts); otherwise
// only the fields that are set.
nlohmann::ordered_json MessageToJsonValue(const google::protobuf::Message& m, bool every_field);

}  // namespace ftd::spec

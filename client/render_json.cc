// ftctl's JSON form of any message (render.h): proto3 JSON with the .proto field names and every
// scalar present, 64-bit integers as numbers (spec/proto_json.h).
#include "client/render.h"

#include "spec/proto_json.h"

namespace ftd::client {

nlohmann::ordered_json ToJsonValue(const google::protobuf::Message& m) {
  return ftd::spec::MessageToJsonValue(m, /*every_field=*/true);
}

std::string ToJson(const google::protobuf::Message& m, bool pretty) { return ToJsonValue(m).dump(pretty ? 2 : -1); }

}  // namespace ftd::client

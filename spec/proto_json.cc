#include "spec/proto_json.h"

#include <google/protobuf/util/json_util.h>

namespace ftd::spec {

namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using nlohmann::ordered_json;

bool Is64Bit(const FieldDescriptor* f) {
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT64: return true;
    default: return false;
  }
}

// proto3 JSON's "123" for a 64-bit integer -> 123.
void NumberFromString(const FieldDescriptor* f, ordered_json* v) {
  if (!v->is_string()) return;
  const std::string s = v->get<std::string>();
  try {
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64) {
      *v = static_cast<uint64_t>(std::stoull(s));
    } else {
      *v = static_cast<int64_t>(std::stoll(s));
    }
  } catch (const std::exception&) {
    // not a number: left as it is
  }
}

void Int64AsNumbers(const Descriptor* d, ordered_json* j) {
  if (!j->is_object()) return;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    auto it = j->find(f->name());
    if (it == j->end()) continue;
    if (f->is_map()) {
      const FieldDescriptor* value = f->message_type()->map_value();
      for (auto& [k, v] : it->items()) {
        if (value->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) Int64AsNumbers(value->message_type(), &v);
        else if (Is64Bit(value)) NumberFromString(value, &v);
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (auto& e : *it) Int64AsNumbers(f->message_type(), &e);
      } else {
        Int64AsNumbers(f->message_type(), &*it);
      }
    } else if (Is64Bit(f)) {
      if (f->is_repeated()) {
        for (auto& e : *it) NumberFromString(f, &e);
      } else {
        NumberFromString(f, &*it);
      }
    }
  }
}

}  // namespace

ordered_json MessageToJsonValue(const google::protobuf::Message& m, bool every_field) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = every_field;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  ordered_json j = ordered_json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return ordered_json::object();
  Int64AsNumbers(m.GetDescriptor(), &j);
  return j;
}

}  // namespace ftd::spec

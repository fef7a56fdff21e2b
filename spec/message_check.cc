#include "spec/message_check.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/unknown_field_set.h"
#include "spec/message_walk.h"
#include "spec/text.h"

namespace ftd::spec {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using google::protobuf::UnknownField;

const char* WireTypeName(UnknownField::Type t) {
  switch (t) {
    case UnknownField::TYPE_VARINT: return "varint";
    case UnknownField::TYPE_FIXED32: return "fixed32";
    case UnknownField::TYPE_FIXED64: return "fixed64";
    case UnknownField::TYPE_LENGTH_DELIMITED: return "length-delimited";
    case UnknownField::TYPE_GROUP: return "group";
  }
  return "unknown";
}

absl::Status Finite(const std::string& field, double v) {
  if (std::isfinite(v)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " must be a finite number (got ", v, ")"));
}

absl::Status KnownEnum(const std::string& field, const FieldDescriptor* f, int v) {
  const auto* e = f->enum_type();
  if (e->FindValueByNumber(v) != nullptr) return absl::OkStatus();
  std::vector<std::string> names;
  for (int i = 0; i < e->value_count(); ++i) {
    if (e->value(i)->number() != 0) names.push_back(std::string(e->value(i)->name()));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is ", v, ", not a ", e->name(), " value: use one of ", absl::StrJoin(names, ", ")));
}

class Checker final : public MessageVisitor {
 public:
  absl::Status OnMessage(const Message& m, const std::string& path) override {
    const auto& unknown = m.GetReflection()->GetUnknownFields(m);
    if (unknown.empty()) return absl::OkStatus();
    const UnknownField& u = unknown.field(0);
    return absl::InvalidArgumentError(absl::StrCat(
        path.empty() ? std::string(m.GetDescriptor()->name()) : path, " holds field number ", u.number(), " (",
        WireTypeName(u.type()), "), which this build of ftd does not know: a newer client's field or a corrupt "
        "message; drop the field or upgrade ftd"));
  }
  absl::Status OnValue(const Message& m, const FieldDescriptor* f, int i, const std::string& field) override {
    const Reflection* r = m.GetReflection();
    const bool rep = i >= 0;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_DOUBLE:
        return Finite(field, rep ? r->GetRepeatedDouble(m, f, i) : r->GetDouble(m, f));
      case FieldDescriptor::CPPTYPE_FLOAT:
        return Finite(field, rep ? r->GetRepeatedFloat(m, f, i) : r->GetFloat(m, f));
      case FieldDescriptor::CPPTYPE_ENUM:
        return KnownEnum(field, f, rep ? r->GetRepeatedEnumValue(m, f, i) : r->GetEnumValue(m, f));
      case FieldDescriptor::CPPTYPE_STRING: {
        if (f->type() == FieldDescriptor::TYPE_BYTES) return absl::OkStatus();
        std::string scratch;
        const std::string& v =
            rep ? r->GetRepeatedStringReference(m, f, i, &scratch) : r->GetStringReference(m, f, &scratch);
        return CheckNoControlChars(v, field);
      }
      default:
        return absl::OkStatus();
    }
  }
};

}  // namespace

absl::Status CheckMessage(const Message& m, std::string_view root) {
  Checker checker;
  return WalkMessage(m, std::string(root), checker);
}

}  // namespace ftd::spec

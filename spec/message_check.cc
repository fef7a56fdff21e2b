#include "spec/message_check.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/unknown_field_set.h"

namespace ftd::spec {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using google::protobuf::UnknownField;

std::string Join(const std::string& path, const std::string& name) {
  return path.empty() ? name : absl::StrCat(path, ".", name);
}

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

absl::Status Check(const Message& m, const std::string& path) {
  const Reflection* r = m.GetReflection();
  const auto& unknown = r->GetUnknownFields(m);
  if (!unknown.empty()) {
    const UnknownField& u = unknown.field(0);
    return absl::InvalidArgumentError(absl::StrCat(
        path.empty() ? std::string(m.GetDescriptor()->name()) : path, " holds field number ", u.number(), " (",
        WireTypeName(u.type()), "), which this build of ftd does not know: a newer client's field or a corrupt "
        "message; drop the field or upgrade ftd"));
  }
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string name = Join(path, std::string(f->name()));
    const int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
    for (int i = 0; i < n; ++i) {
      const std::string field = f->is_repeated() ? absl::StrCat(name, "[", i, "]") : name;
      absl::Status st;
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_DOUBLE:
          st = Finite(field, f->is_repeated() ? r->GetRepeatedDouble(m, f, i) : r->GetDouble(m, f));
          break;
        case FieldDescriptor::CPPTYPE_FLOAT:
          st = Finite(field, f->is_repeated() ? r->GetRepeatedFloat(m, f, i) : r->GetFloat(m, f));
          break;
        case FieldDescriptor::CPPTYPE_ENUM:
          st = KnownEnum(field, f, f->is_repeated() ? r->GetRepeatedEnumValue(m, f, i) : r->GetEnumValue(m, f));
          break;
        case FieldDescriptor::CPPTYPE_MESSAGE:
          st = Check(f->is_repeated() ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f), field);
          break;
        default:
          break;
      }
      if (!st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckMessage(const Message& m, std::string_view root) { return Check(m, std::string(root)); }

}  // namespace ftd::spec

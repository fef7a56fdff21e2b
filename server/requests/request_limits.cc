#include "server/requests/request_limits.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/stubs/common.h>
#include <google/protobuf/wire_format_lite.h>

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "spec/message_walk.h"

namespace ftd::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using google::protobuf::internal::WireFormatLite;

// The check protobuf's own parser applies to proto3 strings.
bool ValidUtf8(std::string_view s) {
  return google::protobuf::internal::IsStructurallyValidUTF8(s.data(), static_cast<int>(s.size()));
}

size_t MaxBytes(const FieldDescriptor* f) {
  const std::string& n = f->name();
  return absl::EndsWith(n, "path") || absl::EndsWith(n, "dir") ? kMaxPathBytes : kMaxNameBytes;
}

absl::Status CheckString(const std::string& path, const std::string& v, size_t max) {
  if (!ValidUtf8(v)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not valid UTF-8 (", v.size(),
                                                   " bytes); send text encoded as UTF-8"));
  }
  if (v.size() > max) {
    return absl::InvalidArgumentError(absl::StrCat(path, " must be at most ", max, " bytes (got ", v.size(),
                                                   " bytes: \"", Clip(v, 48), "\")"));
  }
  return absl::OkStatus();
}

// Strings (length, UTF-8) and the entries of repeated and map fields; bytes fields are not text.
class StringLimits final : public spec::MessageVisitor {
 public:
  absl::StatusOr<bool> OnField(const Message& m, const FieldDescriptor* f, const std::string& path) override {
    if (f->type() == FieldDescriptor::TYPE_BYTES) return false;
    if (f->is_repeated()) {
      const int n = m.GetReflection()->FieldSize(m, f);
      if (n > kMaxEntries) {
        return absl::InvalidArgumentError(absl::StrCat(path, " must have at most ", kMaxEntries, " entries (got ", n, ")"));
      }
    }
    return true;
  }
  absl::Status OnValue(const Message& m, const FieldDescriptor* f, int i, const std::string& path) override {
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_STRING) return absl::OkStatus();
    const Reflection* r = m.GetReflection();
    std::string scratch;
    const std::string& v = i >= 0 ? r->GetRepeatedStringReference(m, f, i, &scratch) : r->GetStringReference(m, f, &scratch);
    return CheckString(path, v, MaxBytes(f));
  }
};

}  // namespace

absl::Status CheckRequestStrings(const Message& m, const std::string& prefix) {
  // The walk joins a path with "."; the prefix ends with one ("spec.") or is empty.
  const std::string root = absl::EndsWith(prefix, ".") ? prefix.substr(0, prefix.size() - 1) : prefix;
  StringLimits limits;
  return spec::WalkMessage(m, root, limits);
}

std::string FindInvalidUtf8(const Descriptor* type, std::string_view wire) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(wire.data()),
                                            static_cast<int>(wire.size()));
  for (;;) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) return "";
    const FieldDescriptor* f = type->FindFieldByNumber(static_cast<int>(WireFormatLite::GetTagFieldNumber(tag)));
    const bool delimited = WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    if (f == nullptr || !delimited ||
        (f->type() != FieldDescriptor::TYPE_STRING && f->type() != FieldDescriptor::TYPE_MESSAGE)) {
      if (!WireFormatLite::SkipField(&in, tag)) return "";
      continue;
    }
    std::string value;
    if (!WireFormatLite::ReadBytes(&in, &value)) return "";
    if (f->type() == FieldDescriptor::TYPE_STRING) {
      if (!ValidUtf8(value)) return f->name();
      continue;
    }
    const std::string inner = FindInvalidUtf8(f->message_type(), value);
    if (inner.empty()) continue;
    // A map entry's key and value are named after the map.
    return f->is_map() ? f->name() : absl::StrCat(f->name(), ".", inner);
  }
}

std::string Clip(std::string_view s, size_t max) {
  if (s.size() <= max) return std::string(s);
  const auto continuation = [&](size_t i) { return i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80; };
  size_t head = max / 2, tail = s.size() - max / 2;
  while (head > 0 && continuation(head)) --head;
  while (tail < s.size() && continuation(tail)) ++tail;
  return std::string(s.substr(0, head)) + absl::StrCat(" … (", s.size(), " bytes) … ") + std::string(s.substr(tail));
}

}  // namespace ftd::server

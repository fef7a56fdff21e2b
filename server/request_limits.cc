#include "server/request_limits.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/stubs/common.h>
#include <google/protobuf/wire_format_lite.h>

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

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

absl::Status CheckField(const Message& m, const FieldDescriptor* f, const std::string& path) {
  const Reflection* r = m.GetReflection();
  const bool map_entry_parent = f->is_map();
  if (f->is_repeated()) {
    const int n = r->FieldSize(m, f);
    if (n > kMaxEntries) {
      return absl::InvalidArgumentError(absl::StrCat(path, " must have at most ", kMaxEntries, " entries (got ", n, ")"));
    }
    for (int i = 0; i < n; ++i) {
      const std::string item = map_entry_parent ? path : absl::StrCat(path, "[", i, "]");
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
        std::string scratch;
        if (auto st = CheckString(item, r->GetRepeatedStringReference(m, f, i, &scratch), MaxBytes(f)); !st.ok()) {
          return st;
        }
      } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        // A map entry's key and value are named after the map ("spec.kernels"), not "spec.kernels.key".
        const Message& sub = r->GetRepeatedMessage(m, f, i);
        if (map_entry_parent) {
          for (int k = 0; k < sub.GetDescriptor()->field_count(); ++k) {
            const FieldDescriptor* kv = sub.GetDescriptor()->field(k);
            if (kv->cpp_type() != FieldDescriptor::CPPTYPE_STRING) continue;
            std::string scratch;
            const std::string& s = sub.GetReflection()->GetStringReference(sub, kv, &scratch);
            if (auto st = CheckString(absl::StrCat(path, " ", kv->name()), s, kMaxNameBytes); !st.ok()) return st;
          }
        } else if (auto st = CheckRequestStrings(sub, item + "."); !st.ok()) {
          return st;
        }
      }
    }
    return absl::OkStatus();
  }
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
    std::string scratch;
    return CheckString(path, r->GetStringReference(m, f, &scratch), MaxBytes(f));
  }
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) return CheckRequestStrings(r->GetMessage(m, f), path + ".");
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRequestStrings(const Message& m, const std::string& prefix) {
  std::vector<const FieldDescriptor*> fields;
  m.GetReflection()->ListFields(m, &fields);  // the set ones only
  for (const FieldDescriptor* f : fields) {
    if (f->type() == FieldDescriptor::TYPE_BYTES) continue;
    if (auto st = CheckField(m, f, prefix + f->name()); !st.ok()) return st;
  }
  return absl::OkStatus();
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

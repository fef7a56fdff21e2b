#include "spec/message_walk.h"

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ftd::spec {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

std::string Join(const std::string& path, const std::string& name) {
  return path.empty() ? std::string(name) : absl::StrCat(path, ".", name);
}

absl::Status Walk(const Message& m, const std::string& path, MessageVisitor& v);

// A map entry: its key and value named after the map ("spec.kernels key").
absl::Status WalkMapEntry(const Message& entry, const std::string& map_path, MessageVisitor& v) {
  if (auto st = v.OnMessage(entry, map_path); !st.ok()) return st;
  std::vector<const FieldDescriptor*> fields;
  entry.GetReflection()->ListFields(entry, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string path = absl::StrCat(map_path, " ", std::string(f->name()));
    auto go = v.OnField(entry, f, path);
    if (!go.ok()) return go.status();
    if (!*go) continue;
    absl::Status st = f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE
                          ? Walk(entry.GetReflection()->GetMessage(entry, f), path, v)
                          : v.OnValue(entry, f, -1, path);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status Walk(const Message& m, const std::string& path, MessageVisitor& v) {
  if (auto st = v.OnMessage(m, path); !st.ok()) return st;
  const auto* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);  // the set ones only
  for (const FieldDescriptor* f : fields) {
    const std::string name = Join(path, std::string(f->name()));
    auto go = v.OnField(m, f, name);
    if (!go.ok()) return go.status();
    if (!*go) continue;
    const bool message = f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (!f->is_repeated()) {
      absl::Status st = message ? Walk(r->GetMessage(m, f), name, v) : v.OnValue(m, f, -1, name);
      if (!st.ok()) return st;
      continue;
    }
    const int n = r->FieldSize(m, f);
    for (int i = 0; i < n; ++i) {
      absl::Status st;
      if (f->is_map()) {
        st = WalkMapEntry(r->GetRepeatedMessage(m, f, i), name, v);
      } else {
        const std::string item = absl::StrCat(name, "[", i, "]");
        st = message ? Walk(r->GetRepeatedMessage(m, f, i), item, v) : v.OnValue(m, f, i, item);
      }
      if (!st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WalkMessage(const Message& m, const std::string& root, MessageVisitor& visitor) {
  return Walk(m, root, visitor);
}

}  // namespace ftd::spec

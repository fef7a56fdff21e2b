#include "spec/paths.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ftd::spec {

namespace fs = std::filesystem;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

const std::vector<std::string>& SpecPathFields() {
  static const std::vector<std::string> fields = {
      "model.config_path", "model.weights_path", "data.path", "data.tokenizer_path", "data.eval_path",
      "data.cache_dir", "checkpoint.dir", "lora.adapter_path",
  };
  return fields;
}

absl::Status ForEachSpecPath(ftd::v1::TrainSpec* spec,
                             const std::function<absl::Status(const std::string& field, std::string& value)>& fn) {
  for (const std::string& dotted : SpecPathFields()) {
    Message* msg = spec;
    const FieldDescriptor* field = nullptr;
    const std::vector<std::string> parts = absl::StrSplit(dotted, '.');
    for (size_t i = 0; i < parts.size(); ++i) {
      field = msg->GetDescriptor()->FindFieldByName(parts[i]);
      if (field == nullptr) return absl::InternalError(absl::StrCat("SpecPathFields: no field ", dotted));
      if (i + 1 == parts.size()) break;
      // Only descend into a message that is present: an absent one has no paths.
      if (!msg->GetReflection()->HasField(*msg, field)) {
        msg = nullptr;
        break;
      }
      msg = msg->GetReflection()->MutableMessage(msg, field);
    }
    if (msg == nullptr || !msg->GetReflection()->HasField(*msg, field)) continue;
    std::string value = msg->GetReflection()->GetString(*msg, field);
    if (value.empty()) continue;
    const std::string before = value;
    if (auto st = fn(dotted, value); !st.ok()) return st;
    if (value != before) msg->GetReflection()->SetString(msg, field, value);
  }
  return absl::OkStatus();
}

absl::Status ResolveSpecPaths(const std::string& base_dir, ftd::v1::TrainSpec* spec) {
  if (!fs::path(base_dir).is_absolute()) {
    return absl::InvalidArgumentError(absl::StrCat("base directory \"", base_dir, "\" is not absolute"));
  }
  return ForEachSpecPath(spec, [&](const std::string&, std::string& value) {
    if (!fs::path(value).is_absolute()) value = (fs::path(base_dir) / value).lexically_normal().string();
    return absl::OkStatus();
  });
}

}  // namespace ftd::spec

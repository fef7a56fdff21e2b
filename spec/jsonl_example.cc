#include "spec/jsonl_example.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ftd::spec {

using json = nlohmann::json;

namespace {

// The string field `key` of `obj`, or the reason it is not there (after `what`, e.g. "message 2: ").
absl::StatusOr<absl::string_view> StringField(const json& obj, const std::string& key, absl::string_view what) {
  auto it = obj.find(key);
  if (it == obj.end()) return absl::InvalidArgumentError(absl::StrCat(what, "no field \"", key, "\""));
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(what, "field \"", key, "\" is ", it->type_name(), ", not a string"));
  }
  const std::string& s = it->get_ref<const std::string&>();
  return absl::string_view(s.data(), s.size());
}

absl::Status Empty(const std::string& field) {
  return absl::InvalidArgumentError(absl::StrCat("field \"", field, "\" is empty"));
}

}  // namespace

absl::StatusOr<json> ParseJsonlLine(absl::string_view line) {
  if (line.find_first_not_of(" \t\r") == absl::string_view::npos) return absl::InvalidArgumentError("blank line");
  json doc;
  try {
    doc = json::parse(line.begin(), line.end());
  } catch (const json::exception&) {
    return absl::InvalidArgumentError("not valid JSON");  // the parser's message quotes the line
  }
  if (!doc.is_object()) return absl::InvalidArgumentError("not a JSON object");
  return doc;
}

absl::StatusOr<JsonlExample> ReadJsonlExample(const json& doc, const JsonlLayout& f) {
  JsonlExample ex;
  switch (f.kind) {
    case JsonlKind::kText: {
      auto text = StringField(doc, f.text_field, "");
      if (!text.ok()) return text.status();
      if (text->empty()) return Empty(f.text_field);
      ex.text = *text;
      return ex;
    }
    case JsonlKind::kPromptCompletion: {
      auto prompt = StringField(doc, f.prompt_field, "");
      if (!prompt.ok()) return prompt.status();
      auto completion = StringField(doc, f.completion_field, "");
      if (!completion.ok()) return completion.status();
      if (completion->empty()) return Empty(f.completion_field);
      ex.prompt = *prompt;
      ex.completion = *completion;
      return ex;
    }
    case JsonlKind::kChat: break;
  }
  auto it = doc.find(f.messages_field);
  if (it == doc.end()) return absl::InvalidArgumentError(absl::StrCat("no field \"", f.messages_field, "\""));
  if (!it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("field \"", f.messages_field, "\" is ", it->type_name(), ", not a list of messages"));
  }
  if (it->empty()) return Empty(f.messages_field);
  bool any_assistant = false;
  for (size_t m = 0; m < it->size(); ++m) {
    const json& msg = (*it)[m];
    const std::string where = absl::StrCat("message ", m + 1, ": ");
    if (!msg.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, "not a JSON object"));
    auto role = StringField(msg, f.role_field, where);
    if (!role.ok()) return role.status();
    if (std::find(std::begin(kChatRoles), std::end(kChatRoles), *role) == std::end(kChatRoles)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "unknown role \"", *role, "\" (roles: system, user, assistant, tool, ipython)"));
    }
    auto content = StringField(msg, f.content_field, where);
    if (!content.ok()) return content.status();
    any_assistant |= *role == "assistant";
    ex.messages.push_back({*role, *content});
  }
  if (!any_assistant) return absl::InvalidArgumentError("no assistant message (nothing to train on)");
  return ex;
}

absl::Status BadLinesError(absl::string_view summary) {
  return absl::InvalidArgumentError(
      absl::StrCat("spec.data: ", summary, " (fix them, or set data.on_bad_line to \"skip\")"));
}

}  // namespace ftd::spec

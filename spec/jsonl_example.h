// What makes a line of a JSONL dataset a usable example (docs/data-format.md): the one set of rules
// that both the worker, which tokenizes the file (worker/data/dataset.h), and ftd, which checks
// a prefix of it at submit (server/requests/input_contents.h), apply. No tokenizer, no LibTorch, no
// protobuf: the line's JSON object and its fields, checked by the layout data.format names.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ftd::spec {

enum class JsonlKind { kText, kPromptCompletion, kChat };

// data.format and the data.*_field names (spec/train_config.h holds their defaults).
struct JsonlLayout {
  JsonlKind kind = JsonlKind::kText;
  std::string text_field, prompt_field, completion_field, messages_field, role_field, content_field;
};

// The chat roles a message may have; loss is counted on "assistant" only.
inline constexpr absl::string_view kChatRoles[] = {"system", "user", "assistant", "tool", "ipython"};

// One example's strings, as views into the JSON object they were read from.
struct JsonlMessage {
  absl::string_view role, content;
};
struct JsonlExample {
  absl::string_view text;                // kText
  absl::string_view prompt, completion;  // kPromptCompletion
  std::vector<JsonlMessage> messages;    // kChat, in order; at least one "assistant"
};

// A line's JSON object. INVALID_ARGUMENT "blank line", "not valid JSON" (the parser's own message
// would quote the line) or "not a JSON object".
absl::StatusOr<nlohmann::json> ParseJsonlLine(absl::string_view line);

// The example `doc` holds under `layout`, or INVALID_ARGUMENT saying what is wrong with it (no line
// number): a missing field or one of the wrong type, an empty text or completion, a message that is
// not an object or lacks its role or content, an unknown role, a chat without an assistant message.
absl::StatusOr<JsonlExample> ReadJsonlExample(const nlohmann::json& doc, const JsonlLayout& layout);

// The refusal of a file with malformed lines under data.on_bad_line "refuse": `summary` names the
// count, the file and the first lines with their reasons.
absl::Status BadLinesError(absl::string_view summary);

}  // namespace ftd::spec

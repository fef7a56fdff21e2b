// Datasets people have, as token streams with a loss mask: JSONL text, prompt/completion and chat,
// tokenized with the model's own tokenizer (docs/data-format.md). Torch-free and protobuf-free.
//
// Every example becomes a document: its ids, and per id whether the loss counts the prediction of
// that id (1) or not (0). A document's first id is never counted (nothing before it in the
// document predicts it), so packed documents never learn across their boundary.
//   text:              BOS? text EOS                      counted: text, EOS
//   prompt_completion: BOS? prompt completion EOS         counted: completion, EOS
//   chat:              BOS? (<|start_header_id|>ROLE<|end_header_id|>\n\n CONTENT<|eot_id|>)*
//                      counted: CONTENT<|eot_id|> of assistant messages
// BOS? is the tokenizer's post-processor template (text, prompt) or its bos_token (chat), as
// transformers' apply_chat_template renders the LLaMA-3 template; CONTENT is the message's content
// with leading and trailing whitespace removed (Jinja's trim).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "spec/jsonl_example.h"
#include "worker/data/parallel_encode.h"
#include "worker/data/tokenizer.h"

namespace ftd::data {

using spec::JsonlKind;

// The layout (data.format and the field names, from spec.data) and what to do with a bad line. What
// makes a line bad is spec/jsonl_example.h's, which ftd also applies at submit.
struct JsonlFormat : spec::JsonlLayout {
  bool skip_bad_lines = false;  // false: any malformed line fails the whole file

  // "chat" and so on (data.format); an unknown name is an error.
  static absl::StatusOr<JsonlKind> ParseKind(std::string_view format);
  // What the tokenized result depends on besides the file and the tokenizer (the cache key).
  std::string Describe() const;
};

// Tokenized documents: document d is ids[docs[d], docs[d + 1]).
struct Corpus {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> loss;        // per id: 1 = the loss counts predicting this id
  std::vector<uint64_t> docs{0};
  uint64_t lines = 0;               // lines read
  uint64_t bad_line_count = 0;      // malformed lines skipped
  std::string bad_lines_summary;    // DescribeBadLines of them (the first five), empty if none

  size_t num_docs() const { return docs.size() - 1; }
  uint64_t loss_tokens() const;
};

// The chat format above as a chat template (Meta's LLaMA-3 template): transformers'
// apply_chat_template renders with it what chat rendering trains on (tests/python/test_datasets.py),
// and with add_generation_prompt the assistant's header that a reply follows. Written into the
// tokenizer_config.json of a chat fine-tune whose tokenizer has no template (docs/checkpoint-format.md).
inline constexpr std::string_view kLlama3ChatTemplate =
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

// The special tokens chat rendering needs, looked up once.
struct ChatTokens {
  uint32_t start_header = 0, end_header = 0, eot = 0;
  static absl::StatusOr<ChatTokens> Find(const Tokenizer& tokenizer);
};

// Tokenizes a whole JSONL file (`contents`) in parallel, in line order. Malformed lines (blank,
// not a JSON object, a missing or non-string field, an unknown role, an empty completion, a chat
// without an assistant message) fail the call naming the first five with their line numbers, or
// with skip_bad_lines are counted and left out. `source` names the file in messages.
absl::StatusOr<Corpus> TokenizeJsonl(const Tokenizer& tokenizer, std::string_view contents,
                                     const JsonlFormat& format, std::string_view source,
                                     const ParallelOptions& options);

// One line's document, appended to *ids / *loss; a malformed line returns InvalidArgument whose
// message is the reason (no line number).
absl::Status TokenizeJsonlLine(Encoder& encoder, std::string_view line, const JsonlFormat& format,
                               const ChatTokens* chat, std::vector<uint32_t>* ids, std::vector<uint8_t>* loss);

// Python's str.strip() of UTF-8 text (Jinja's trim): leading and trailing Unicode whitespace.
std::string_view StripUnicodeSpace(std::string_view s);

}  // namespace ftd::data

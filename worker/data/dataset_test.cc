// JSONL datasets in the odd but legal forms files come in (docs/data-format.md): Windows line ends
// (CRLF), a UTF-8 byte-order mark before the first line (RFC 8259 lets a parser ignore it; Notepad and
// many exporters write one), no newline after the last line. Each tokenizes to the same documents,
// ids and loss mask as the plain file, in every format; an empty file is refused naming it; a line
// holding only "\r" is a blank line (malformed), named by its number.
#include "worker/data/dataset.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "worker/data/bpe.h"
#include "worker/data/utf8.h"

namespace ftd::data {
namespace {

using nlohmann::json;

// A byte-level tokenizer without merges (ids 0-255 are the bytes), with LLaMA-3's chat tokens and a
// template that puts BOS first.
std::shared_ptr<const Tokenizer> Bytes() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string t;
    AppendUtf8(ByteLevelChar(static_cast<uint8_t>(b)), &t);
    vocab[t] = b;
  }
  json added = json::array();
  uint32_t id = 256;
  for (const char* s : {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}) {
    added.push_back({{"id", id++}, {"content", s}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  }
  const json j = {
      {"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
        {"special_tokens", {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {256}}, {"tokens", {"<|begin_of_text|>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                 {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
                 {"ignore_merges", false}, {"vocab", vocab}, {"merges", json::array()}}}};
  const json config = {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}};
  auto t = Tokenizer::FromJson(j.dump(), config.dump());
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : nullptr;
}

struct Case {
  const char* name;
  JsonlKind kind;
  std::vector<std::string> lines;
};

JsonlFormat Format(JsonlKind kind) {
  JsonlFormat f;
  f.kind = kind;
  f.text_field = "text";
  f.prompt_field = "prompt";
  f.completion_field = "completion";
  f.messages_field = "messages";
  f.role_field = "role";
  f.content_field = "content";
  return f;
}

std::string Join(const std::vector<std::string>& lines, const std::string& end, bool last_end) {
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) out += lines[i] + (i + 1 < lines.size() || last_end ? end : "");
  return out;
}

const Case kCases[] = {
    {"text", JsonlKind::kText, {R"({"text": "Hello world."})", R"({"text": "line two\r\nwith a CRLF inside"})"}},
    {"prompt_completion", JsonlKind::kPromptCompletion,
     {R"({"prompt": "2+2=", "completion": "4"})", R"({"prompt": "Capital of France? ", "completion": "Paris"})"}},
    {"chat", JsonlKind::kChat,
     {R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]})",
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]})"}},
};

TEST(Jsonl, CrlfAByteOrderMarkAndNoFinalNewlineTokenizeAsThePlainFile) {
  auto tok = Bytes();
  ASSERT_TRUE(tok);
  const std::string bom = "\xEF\xBB\xBF";
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const JsonlFormat f = Format(c.kind);
    ParallelOptions o;
    o.threads = 2;
    o.progress = false;
    auto plain = TokenizeJsonl(*tok, Join(c.lines, "\n", true), f, "plain.jsonl", o);
    ASSERT_TRUE(plain.ok()) << plain.status();
    ASSERT_EQ(plain->num_docs(), c.lines.size());
    ASSERT_GT(plain->loss_tokens(), 0u);
    for (const auto& [form, contents] : std::vector<std::pair<std::string, std::string>>{
             {"CRLF", Join(c.lines, "\r\n", true)},
             {"BOM", bom + Join(c.lines, "\n", true)},
             {"BOM and CRLF", bom + Join(c.lines, "\r\n", true)},
             {"no final newline", Join(c.lines, "\n", false)},
             {"CRLF, no final newline", Join(c.lines, "\r\n", false)}}) {
      SCOPED_TRACE(form);
      auto got = TokenizeJsonl(*tok, contents, f, "odd.jsonl", o);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->ids, plain->ids);
      EXPECT_EQ(got->loss, plain->loss);
      EXPECT_EQ(got->docs, plain->docs);
      EXPECT_EQ(got->lines, plain->lines);
      EXPECT_EQ(got->bad_line_count, 0u);
    }
  }
}

TEST(Jsonl, AnEmptyFileIsRefusedAndACarriageReturnLineIsBlank) {
  auto tok = Bytes();
  ASSERT_TRUE(tok);
  ParallelOptions o;
  o.progress = false;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    // An empty file (or one of only a byte-order mark) is refused naming it, before any training.
    for (const std::string contents : {"", "\xEF\xBB\xBF"}) {
      auto empty = TokenizeJsonl(*tok, contents, Format(c.kind), "empty.jsonl", o);
      ASSERT_FALSE(empty.ok());
      EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(empty.status().message().find("empty.jsonl has no usable example"), std::string::npos)
          << empty.status();
    }
    // A blank line between two CRLF lines is malformed, by its number.
    const std::string text = c.lines[0] + "\r\n\r\n" + c.lines[1] + "\r\n";
    auto blank = TokenizeJsonl(*tok, text, Format(c.kind), "blank.jsonl", o);
    ASSERT_FALSE(blank.ok());
    EXPECT_NE(blank.status().message().find("line 2: blank line"), std::string::npos) << blank.status();
    JsonlFormat skip = Format(c.kind);
    skip.skip_bad_lines = true;
    auto skipped = TokenizeJsonl(*tok, text, skip, "blank.jsonl", o);
    ASSERT_TRUE(skipped.ok()) << skipped.status();
    EXPECT_EQ(skipped->num_docs(), 2u);
    EXPECT_EQ(skipped->bad_line_count, 1u);
  }
}

}  // namespace
}  // namespace ftd::data

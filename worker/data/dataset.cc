#include "worker/data/dataset.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/data/strings.h"
#include "worker/data/utf8.h"

namespace ftd::data {

absl::StatusOr<JsonlKind> JsonlFormat::ParseKind(std::string_view format) {
  if (format == "text") return JsonlKind::kText;
  if (format == "prompt_completion") return JsonlKind::kPromptCompletion;
  if (format == "chat") return JsonlKind::kChat;
  return absl::InvalidArgumentError(
      absl::StrCat("data.format must be one of: text, prompt_completion, chat for JSONL (got ", Av(format), ")"));
}

std::string JsonlFormat::Describe() const {
  switch (kind) {
    case JsonlKind::kText: return absl::StrCat("text text_field=", text_field);
    case JsonlKind::kPromptCompletion:
      return absl::StrCat("prompt_completion prompt_field=", prompt_field, " completion_field=", completion_field);
    case JsonlKind::kChat:
      return absl::StrCat("chat messages_field=", messages_field, " role_field=", role_field,
                          " content_field=", content_field);
  }
  return "";
}

uint64_t Corpus::loss_tokens() const {
  uint64_t n = 0;
  for (uint8_t l : loss) n += l;
  return n;
}

absl::StatusOr<ChatTokens> ChatTokens::Find(const Tokenizer& tokenizer) {
  ChatTokens t;
  const std::pair<const char*, uint32_t*> wanted[] = {
      {"<|start_header_id|>", &t.start_header}, {"<|end_header_id|>", &t.end_header}, {"<|eot_id|>", &t.eot}};
  for (const auto& [name, id] : wanted) {
    auto found = tokenizer.TokenToId(name);
    if (!found) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.format \"chat\" renders LLaMA-3's chat format, and the tokenizer has no ", name,
          " token (use a LLaMA-3 tokenizer, or format \"prompt_completion\" or \"text\")"));
    }
    *id = *found;
  }
  return t;
}

namespace {

bool IsPythonSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

absl::Status Encode(Encoder& enc, std::string_view text, bool special, uint8_t counted, std::vector<uint32_t>* ids,
                    std::vector<uint8_t>* loss) {
  EncodeOptions o;
  o.add_special_tokens = special;
  if (auto s = enc.Encode(text, ids, o); !s.ok()) return absl::InternalError(s.message());
  loss->resize(ids->size(), counted);
  return absl::OkStatus();
}

void Push(uint32_t id, uint8_t counted, std::vector<uint32_t>* ids, std::vector<uint8_t>* loss) {
  ids->push_back(id);
  loss->push_back(counted);
}

absl::Status Eos(const Tokenizer& t, std::vector<uint32_t>* ids, std::vector<uint8_t>* loss) {
  if (!t.eos_id()) {
    return absl::InternalError(
        "the tokenizer has no eos_token (tokenizer_config.json): data formats text and prompt_completion end each "
        "example with it");
  }
  Push(*t.eos_id(), 1, ids, loss);
  return absl::OkStatus();
}

absl::Status Chat(Encoder& enc, const spec::JsonlExample& ex, const ChatTokens& ct, std::vector<uint32_t>* ids,
                  std::vector<uint8_t>* loss) {
  if (enc.tokenizer().bos_id()) Push(*enc.tokenizer().bos_id(), 0, ids, loss);
  for (const auto& [role, content] : ex.messages) {
    const uint8_t counted = role == "assistant" ? 1 : 0;
    // The header is encoded apart from the content so the mask starts exactly at the content; the
    // pieces are the same as the whole message's, since the header ends in "\n\n" and the trimmed
    // content starts with no whitespace (tests/python/test_datasets.py checks this against
    // apply_chat_template).
    Push(ct.start_header, 0, ids, loss);
    if (auto s = Encode(enc, Sv(role), false, 0, ids, loss); !s.ok()) return s;
    Push(ct.end_header, 0, ids, loss);
    if (auto s = Encode(enc, "\n\n", false, 0, ids, loss); !s.ok()) return s;
    if (auto s = Encode(enc, StripUnicodeSpace(Sv(content)), false, counted, ids, loss); !s.ok()) return s;
    Push(ct.eot, counted, ids, loss);
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view StripUnicodeSpace(std::string_view s) {
  // Valid UTF-8 only (JSON strings are); an invalid byte ends the scan.
  size_t begin = 0;
  while (begin < s.size()) {
    const size_t valid = ValidUtf8Prefix(s.substr(begin, std::min<size_t>(4, s.size() - begin)));
    if (valid == 0) break;
    size_t len = 0;
    const char32_t c = DecodeUtf8At(s.substr(0, begin + valid), begin, &len);
    if (!IsPythonSpace(c)) break;
    begin += len;
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;  // back to the lead byte
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    const std::string_view cp = s.substr(start, end - start);
    if (!IsValidUtf8(cp)) break;
    size_t len = 0;
    if (!IsPythonSpace(DecodeUtf8At(cp, 0, &len))) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

absl::Status TokenizeJsonlLine(Encoder& enc, std::string_view line, const JsonlFormat& f, const ChatTokens* chat,
                               std::vector<uint32_t>* ids, std::vector<uint8_t>* loss) {
  auto doc = spec::ParseJsonlLine(Av(line));
  if (!doc.ok()) return doc.status();
  auto ex = spec::ReadJsonlExample(*doc, f);
  if (!ex.ok()) return ex.status();
  const Tokenizer& tok = enc.tokenizer();
  const size_t start = ids->size();
  absl::Status st;
  switch (f.kind) {
    case JsonlKind::kText:
      st = Encode(enc, Sv(ex->text), true, 1, ids, loss);
      if (st.ok()) st = Eos(tok, ids, loss);
      break;
    case JsonlKind::kPromptCompletion:
      st = Encode(enc, Sv(ex->prompt), true, 0, ids, loss);
      if (st.ok()) st = Encode(enc, Sv(ex->completion), false, 1, ids, loss);
      if (st.ok()) st = Eos(tok, ids, loss);
      break;
    case JsonlKind::kChat:
      st = Chat(enc, *ex, *chat, ids, loss);
      break;
  }
  // A line's mistakes are InvalidArgument (above); what fails in encoding is not the line's.
  if (!st.ok()) return absl::InternalError(st.message());
  if (ids->size() > start) (*loss)[start] = 0;  // nothing in the document predicts its first id
  return absl::OkStatus();
}

absl::StatusOr<Corpus> TokenizeJsonl(const Tokenizer& tokenizer, std::string_view contents, const JsonlFormat& format,
                                     std::string_view source, const ParallelOptions& options) {
  ChatTokens chat;
  if (format.kind == JsonlKind::kChat) {
    auto ct = ChatTokens::Find(tokenizer);
    if (!ct.ok()) return ct.status();
    chat = *ct;
  } else if (!tokenizer.eos_id()) {
    return absl::InvalidArgumentError(
        "the tokenizer has no eos_token (tokenizer_config.json): data formats text and prompt_completion end each "
        "example with it");
  }
  const LineChunks lc = ChunkLines(contents, options.chunk_bytes);
  const auto& lines = lc.lines;
  const auto& bounds = lc.bounds;
  const size_t chunks = lc.size();
  struct Part {
    std::vector<uint32_t> ids;
    std::vector<uint8_t> loss;
    std::vector<uint64_t> ends;  // document ends, relative to the part
    std::vector<BadLine> bad;
  };
  std::vector<Part> parts(chunks);
  auto st = RunChunks(tokenizer, lc.bytes, options, [&](Encoder& enc, size_t c) -> absl::Status {
    Part& out = parts[c];
    for (size_t r = bounds[c]; r < bounds[c + 1]; ++r) {
      auto s = TokenizeJsonlLine(enc, lines[r], format, &chat, &out.ids, &out.loss);
      if (absl::IsInvalidArgument(s)) {
        out.bad.push_back({r + 1, std::string(s.message())});
        continue;
      }
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat(Av(source), " line ", r + 1, ": ", s.message()));
      out.ends.push_back(out.ids.size());
    }
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  Corpus all;
  all.lines = lines.size();
  std::vector<BadLine> bad;
  size_t total = 0;
  for (const Part& p : parts) total += p.ids.size();
  all.ids.reserve(total);
  all.loss.reserve(total);
  for (Part& p : parts) {
    const uint64_t base = all.ids.size();
    all.ids.insert(all.ids.end(), p.ids.begin(), p.ids.end());
    all.loss.insert(all.loss.end(), p.loss.begin(), p.loss.end());
    for (uint64_t e : p.ends) all.docs.push_back(base + e);
    for (BadLine& b : p.bad) {
      if (bad.size() < 5) bad.push_back(std::move(b));
      ++all.bad_line_count;
    }
  }
  if (all.bad_line_count > 0) {
    all.bad_lines_summary = DescribeBadLines(bad, source);
    if (all.bad_line_count > bad.size()) {
      // DescribeBadLines counts what it is given: say the true count.
      all.bad_lines_summary = absl::StrCat(all.bad_line_count, " bad lines in ", Av(source),
                                           all.bad_lines_summary.substr(all.bad_lines_summary.find(':')), "; ...");
    }
    if (!format.skip_bad_lines) {
      return spec::BadLinesError(Av(all.bad_lines_summary));
    }
  }
  if (all.num_docs() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("spec.data.path: ", Av(source), " has no usable example"));
  }
  return all;
}

}  // namespace ftd::data

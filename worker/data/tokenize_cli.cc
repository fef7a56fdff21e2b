#include "worker/data/tokenize_cli.h"

#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "worker/data/parallel_encode.h"
#include "worker/data/regex.h"
#include "worker/data/strings.h"
#include "worker/data/tokenizer.h"

namespace ftd::data {
namespace {

using json = nlohmann::json;

double ProcessCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

std::string JsonString(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

int Fail(int code, absl::string_view message) {
  std::cerr << "ftd-worker tokenize: " << message << "\n";
  return code;
}

// The records of `input` in format `format` (not jsonl).
absl::StatusOr<std::vector<std::string_view>> Records(std::string_view input, const std::string& format) {
  if (format == "lines") return SplitLines(input);
  if (format == "text") return std::vector<std::string_view>{input};
  std::vector<std::string_view> out;  // records
  size_t pos = 0;
  while (pos < input.size()) {
    if (input.size() - pos < 4) return absl::InvalidArgumentError("records input ends inside a length prefix");
    uint32_t len;
    std::memcpy(&len, input.data() + pos, 4);  // little-endian hosts only, as the token files
    pos += 4;
    if (input.size() - pos < len) {
      return absl::InvalidArgumentError(absl::StrCat("records input: record ", out.size() + 1, " needs ", len,
                                                     " bytes, ", input.size() - pos, " are left"));
    }
    out.push_back(input.substr(pos, len));
    pos += len;
  }
  return out;
}

json Info(const Tokenizer& t) {
  json added = json::array();
  for (const AddedToken* a : t.added().Tokens()) {
    added.push_back({{"id", a->id}, {"content", a->content}, {"special", a->special}});
  }
  json prefix = json::array(), suffix = json::array();
  for (uint32_t id : t.template_prefix()) prefix.push_back(id);
  for (uint32_t id : t.template_suffix()) suffix.push_back(id);
  return {{"vocab_size", t.vocab_size()},
          {"model_vocab", t.model().size()},
          {"merges", t.model().num_merges()},
          {"ignore_merges", t.model().ignore_merges()},
          {"added_tokens", added},
          {"pre_tokenizer", t.pre_tokenizer().Describe()},
          {"template_prefix", prefix},
          {"template_suffix", suffix},
          {"bos_id", t.bos_id() ? json(*t.bos_id()) : json()},
          {"eos_id", t.eos_id() ? json(*t.eos_id()) : json()},
          {"pcre2", Pcre2Version()},
          {"unicode", Pcre2UnicodeVersion()}};
}

int Decode(const Tokenizer& t, std::string_view input, const TokenizeCommand& c) {
  std::string out;
  std::vector<uint32_t> ids;
  const auto lines = SplitLines(input);
  for (size_t l = 0; l < lines.size(); ++l) {
    ids.clear();
    for (absl::string_view tok : absl::StrSplit(Av(lines[l]), absl::ByAnyChar(" \t\r,"), absl::SkipEmpty())) {
      uint32_t id;
      if (!absl::SimpleAtoi(tok, &id)) {
        return Fail(1, absl::StrCat("line ", l + 1, ": \"", tok, "\" is not a token id"));
      }
      ids.push_back(id);
    }
    auto text = t.Decode(ids, c.skip_special);
    if (!text.ok()) return Fail(1, absl::StrCat("line ", l + 1, ": ", text.status().message()));
    absl::StrAppend(&out, c.json ? JsonString(*text) : *text, "\n");
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

std::unique_ptr<TokenizeCommand> AddTokenizeCommand(CLI::App* app) {
  auto c = std::make_unique<TokenizeCommand>();
  CLI::App* cmd = app->add_subcommand(
      "tokenize", "Encode or decode with a model directory's tokenizer (tokenizer.json), reading stdin or --input");
  c->cmd = cmd;
  cmd->add_option("--tokenizer", c->dir, "Model directory with tokenizer.json (and tokenizer_config.json)")
      ->required();
  cmd->add_option("--input", c->input, "Input file ('-': stdin)");
  cmd->add_option("--format", c->format, "Input records: lines, text (all one record), jsonl, records (length-prefixed)")
      ->check(CLI::IsMember({"lines", "text", "jsonl", "records"}));
  cmd->add_option("--field", c->field, "The string field of each JSONL object (--format jsonl)");
  cmd->add_option("--output", c->output, "Write the ids of all records as a uint32 token file instead of text");
  cmd->add_option("--threads", c->threads, "Encoding threads (0: all cores)");
  cmd->add_flag("--no-special", c->no_special, "Leave out the template's special tokens (LLaMA-3: BOS)");
  cmd->add_flag("--eos", c->eos, "Append tokenizer_config.json's eos_token after each record");
  cmd->add_flag("--decode", c->decode, "Decode lines of ids (space-separated) into text, one line each");
  cmd->add_flag("--skip-special", c->skip_special, "With --decode: leave special tokens out");
  cmd->add_flag("--json", c->json, "With --decode: print each text as a JSON string");
  cmd->add_flag("--pieces", c->pieces, "Print each record's pre-tokenized pieces as a JSON array");
  cmd->add_flag("--info", c->info, "Print what was loaded as JSON");
  cmd->add_flag("--stats", c->stats, "Print records, bytes, tokens, encoding time and CPU time as JSON on stderr");
  cmd->add_flag("--skip-bad-lines", c->skip_bad_lines, "With --format jsonl: skip malformed lines instead of failing");
  cmd->add_flag("--no-progress", c->no_progress, "No progress bar");
  return c;
}

int RunTokenizeCommand(const TokenizeCommand& c) {
  auto loaded = Tokenizer::LoadDir(c.dir);
  if (!loaded.ok()) return Fail(2, loaded.status().message());
  const Tokenizer& tok = **loaded;
  if (c.info) {
    std::cout << Info(tok).dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
    return 0;
  }
  std::string stdin_data;
  std::optional<MappedFile> file;
  std::string_view input;
  if (c.input == "-") {
    stdin_data.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    input = stdin_data;
  } else {
    auto f = MappedFile::Open(c.input);
    if (!f.ok()) return Fail(2, f.status().message());
    file.emplace(*std::move(f));
    input = file->contents();
  }
  if (c.decode) return Decode(tok, input, c);

  ParallelOptions opts;
  opts.threads = c.threads;
  opts.progress = !c.no_progress;
  opts.encode.add_special_tokens = !c.no_special;
  if (c.eos && !tok.eos_id()) return Fail(2, "--eos: tokenizer_config.json names no eos_token");

  if (c.pieces) {
    if (c.format == "jsonl") return Fail(2, "--pieces reads lines, text or records, not jsonl");
    auto records = Records(input, c.format);
    if (!records.ok()) return Fail(2, records.status().message());
    Encoder enc(tok);
    std::string out;
    std::vector<std::string> pieces;
    for (std::string_view r : *records) {
      pieces.clear();
      if (auto st = enc.Pieces(r, &pieces); !st.ok()) return Fail(2, st.message());
      absl::StrAppend(&out, json(pieces).dump(-1, ' ', false, json::error_handler_t::replace), "\n");
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }

  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = ProcessCpuSeconds();
  EncodedRecords encoded;
  if (c.format == "jsonl") {
    auto r = EncodeJsonlField(tok, input, c.field, opts);
    if (!r.ok()) return Fail(2, r.status().message());
    if (!r->bad_lines.empty()) {
      const std::string what = DescribeBadLines(r->bad_lines, absl::StrCat(c.input == "-" ? "stdin" : c.input,
                                                                           " (field \"", c.field, "\")"));
      if (!c.skip_bad_lines) return Fail(1, what + " (--skip-bad-lines skips them)");
      std::cerr << "ftd-worker tokenize: skipped " << what << "\n";
    }
    encoded = std::move(r->records);
  } else {
    auto records = Records(input, c.format);
    if (!records.ok()) return Fail(2, records.status().message());
    auto r = EncodeRecords(tok, *records, opts);
    if (!r.ok()) return Fail(2, r.status().message());
    encoded = *std::move(r);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu_seconds = ProcessCpuSeconds() - cpu0;

  if (c.stats) {
    std::cerr << json{{"records", encoded.size()},
                      {"bytes", input.size()},
                      {"tokens", encoded.ids.size()},
                      {"threads", ResolveThreads(c.threads)},
                      {"seconds", seconds},
                      {"cpu_seconds", cpu_seconds},
                      {"mb_per_s", static_cast<double>(input.size()) / 1e6 / seconds}}
                     .dump()
              << std::endl;
  }
  const uint32_t eos = c.eos ? *tok.eos_id() : 0;
  if (!c.output.empty()) {
    std::FILE* f = std::fopen(c.output.c_str(), "wb");
    if (f == nullptr) return Fail(2, absl::StrCat("cannot write ", c.output, ": ", std::strerror(errno)));
    bool ok = true;
    for (size_t r = 0; r < encoded.size() && ok; ++r) {
      const auto ids = encoded[r];
      ok = std::fwrite(ids.data(), sizeof(uint32_t), ids.size(), f) == ids.size();
      if (ok && c.eos) ok = std::fwrite(&eos, sizeof eos, 1, f) == 1;
    }
    ok = (std::fclose(f) == 0) && ok;
    if (!ok) return Fail(2, absl::StrCat("error writing ", c.output));
    return 0;
  }
  std::string out;
  for (size_t r = 0; r < encoded.size(); ++r) {
    const auto ids = encoded[r];
    for (size_t i = 0; i < ids.size(); ++i) absl::StrAppend(&out, i ? " " : "", ids[i]);
    if (c.eos) absl::StrAppend(&out, ids.empty() ? "" : " ", eos);
    out += '\n';
    if (out.size() > (1 << 20)) {
      std::fwrite(out.data(), 1, out.size(), stdout);
      out.clear();
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace ftd::data

// `ftd-worker tokenize`: encode or decode with a model directory's tokenizer, for debugging and
// for making token files (docs/data-format.md).
//
//   ftd-worker tokenize --tokenizer DIR < text.txt              one line of ids per input line
//   ftd-worker tokenize --tokenizer DIR --format jsonl --field text --input data.jsonl --output train.bin
//   ftd-worker tokenize --tokenizer DIR --decode < ids.txt       one decoded text per line of ids
//   ftd-worker tokenize --tokenizer DIR --pieces                 the pre-tokenized pieces (JSON)
//   ftd-worker tokenize --tokenizer DIR --info                   what was loaded (JSON)
// Input formats: lines (each line a record, '\n' left out), text (the whole input one record), jsonl
// (a string field of each line's object), records (each record a little-endian uint32 byte
// length then the bytes: any bytes, newlines included). Exit codes: 0 ok, 1 bad input lines,
// 2 a bad tokenizer, option or file.
#pragma once

#include <memory>
#include <string>

#include "CLI/CLI.hpp"

namespace ftd::data {

struct TokenizeCommand {
  CLI::App* cmd = nullptr;
  std::string dir;
  std::string input = "-";
  std::string format = "lines";
  std::string field = "text";
  std::string output;
  int threads = 0;
  bool no_special = false, eos = false, decode = false, skip_special = false, json = false, pieces = false,
       info = false, stats = false, skip_bad_lines = false, no_progress = false;
};

// Registers the `tokenize` subcommand on `app`.
std::unique_ptr<TokenizeCommand> AddTokenizeCommand(CLI::App* app);
// Runs it; returns the process exit code.
int RunTokenizeCommand(const TokenizeCommand& c);

}  // namespace ftd::data

// ftctl's one set of output formats (-o table|json|yaml) for list, get, compare and profile.
#pragma once

#include <ostream>
#include <string>
#include <string_view>

#include "CLI/CLI.hpp"
#include "nlohmann/json.hpp"

namespace ftd::client {

enum class OutputFormat { kTable, kJson, kYaml };

// Writes chunks of a byte stream (a job's log) to `out`: escaped as Shown (render.h) does, but for newlines and
// tabs, when `escape` (the output is a terminal); as they are otherwise. A UTF-8 character split
// between two chunks is written whole.
class StreamPrinter {
 public:
  StreamPrinter(std::ostream& out, bool escape) : out_(out), escape_(escape) {}
  void Write(std::string_view chunk);
  void Finish();  // writes what is left of a character the stream ended in

 private:
  std::ostream& out_;
  bool escape_;
  std::string carry_;
};

// Adds -o/--output table|json|yaml (default table) to `cmd`.
CLI::Option* AddOutputFlag(CLI::App* cmd, OutputFormat* format);

// `value` as indented JSON or as YAML (the same structure), ending with a newline.
std::string Emit(const nlohmann::ordered_json& value, OutputFormat format);

}  // namespace ftd::client

// ftctl's one set of output formats (-o table|json|yaml) for list, get, compare and profile.
#pragma once

#include <string>

#include "CLI/CLI.hpp"
#include "nlohmann/json.hpp"

namespace ftd::client {

enum class OutputFormat { kTable, kJson, kYaml };

// Adds -o/--output table|json|yaml (default table) to `cmd`.
CLI::Option* AddOutputFlag(CLI::App* cmd, OutputFormat* format);

// `value` as indented JSON or as YAML (the same structure), ending with a newline.
std::string Emit(const nlohmann::ordered_json& value, OutputFormat format);

}  // namespace ftd::client

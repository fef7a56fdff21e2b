#include "client/output.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <map>

#include "client/cli_help.h"
#include "spec/text.h"

namespace ftd::client {

using nlohmann::ordered_json;

void StreamPrinter::Write(std::string_view chunk) {
  if (!escape_) {
    out_ << chunk << std::flush;
    return;
  }
  std::string text = carry_ + std::string(chunk);
  // Holds back the start of a UTF-8 sequence the chunk ends in (at most 3 bytes) for the next one.
  size_t keep = 0;
  for (size_t back = 1; back <= std::min<size_t>(3, text.size()); ++back) {
    const auto c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    if (need > back) keep = back;
    break;
  }
  carry_ = text.substr(text.size() - keep);
  text.resize(text.size() - keep);
  out_ << ftd::spec::EscapeControl(text, "\n\t") << std::flush;
}

void StreamPrinter::Finish() {
  if (!carry_.empty()) out_ << ftd::spec::EscapeControl(carry_, "\n\t") << std::flush;
  carry_.clear();
}

CLI::Option* AddOutputFlag(CLI::App* cmd, OutputFormat* format) {
  // In the order of OutputFormat's values.
  return cmd->add_option("-o,--output", *format, "table (default), json or yaml")
      ->transform(OneOf({"table", "json", "yaml"}, /*to_index=*/true))
      ->option_text("table|json|yaml");
}

namespace {

// Whether `s` written plain reads back as this string (not a number, boolean, null or other YAML).
bool ReadsBackAsString(const std::string& s) {
  if (s.empty() || !ordered_json::parse(s, nullptr, /*allow_exceptions=*/false).is_discarded()) return false;
  for (const char* special : {"~", "null", "Null", "NULL", "True", "False", "TRUE", "FALSE", "yes", "no", "on", "off"}) {
    if (s == special) return false;
  }
  try {
    const YAML::Node back = YAML::Load(s);
    return back.IsScalar() && back.Scalar() == s;
  } catch (const YAML::Exception&) {
    return false;
  }
}

void EmitYaml(const ordered_json& v, YAML::Emitter& out) {
  switch (v.type()) {
    case ordered_json::value_t::object:
      out << YAML::BeginMap;
      for (const auto& [k, x] : v.items()) {
        out << YAML::Key << k << YAML::Value;
        EmitYaml(x, out);
      }
      out << YAML::EndMap;
      break;
    case ordered_json::value_t::array:
      out << YAML::BeginSeq;
      for (const auto& x : v) EmitYaml(x, out);
      out << YAML::EndSeq;
      break;
    case ordered_json::value_t::string: {
      const std::string s = v.get<std::string>();
      // Double-quoted YAML writes control characters as escapes.
      if (!ReadsBackAsString(s) || ftd::spec::FindControlChar(s).has_value()) out << YAML::DoubleQuoted;
      out << s;
      break;
    }
    case ordered_json::value_t::boolean: out << (v.get<bool>() ? "true" : "false"); break;
    case ordered_json::value_t::null: out << YAML::Null; break;
    default: out << v.dump(); break;  // numbers as JSON writes them (exact, round-trippable)
  }
}

}  // namespace

std::string Emit(const ordered_json& value, OutputFormat format) {
  if (format == OutputFormat::kYaml) {
    YAML::Emitter out;
    EmitYaml(value, out);
    return std::string(out.c_str()) + "\n";
  }
  return value.dump(2) + "\n";
}

}  // namespace ftd::client

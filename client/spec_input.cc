#include "client/spec_input.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "spec/spec.h"

namespace ftd::client {

using nlohmann::json;

SpecFormat DetectSpecFormat(const std::string& name, const std::string& text) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (absl::EndsWith(lower, ".yaml") || absl::EndsWith(lower, ".yml")) return SpecFormat::kYaml;
  if (absl::EndsWith(lower, ".json")) return SpecFormat::kJson;
  const auto first = text.find_first_not_of(" \t\r\n");
  return first != std::string::npos && text[first] == '{' ? SpecFormat::kJson : SpecFormat::kYaml;
}

namespace {

// A plain (unquoted) YAML scalar as the JSON value it reads as (YAML 1.2 core schema).
json PlainScalar(const std::string& s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  if (s == ".inf" || s == "+.inf" || s == "-.inf" || s == ".nan") return s;  // protobuf's JSON takes these as strings
  json n = json::parse(s, nullptr, /*allow_exceptions=*/false);
  if (!n.is_discarded() && n.is_number()) return n;
  return s;
}

// A spec has a few hundred values; aliases that repeat aliases expand exponentially (nine levels of
// a 306-byte file ran for minutes), so the expansion stops here.
constexpr int64_t kMaxYamlValues = 100'000;
constexpr int kMaxYamlDepth = 64;

struct TooLarge {};  // thrown out of YamlToJson when the budget is spent

json YamlToJson(const YAML::Node& node, int64_t& budget, int depth) {
  if (--budget < 0 || depth > kMaxYamlDepth) throw TooLarge{};
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: return nullptr;
    case YAML::NodeType::Scalar:
      // "!" is the tag of a quoted scalar: a string whatever it looks like.
      return node.Tag() == "!" ? json(node.Scalar()) : PlainScalar(node.Scalar());
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& item : node) a.push_back(YamlToJson(item, budget, depth + 1));
      return a;
    }
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto& kv : node) o[kv.first.as<std::string>()] = YamlToJson(kv.second, budget, depth + 1);
      return o;
    }
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<ftd::v1::TrainSpec> ParseSpecText(const std::string& name, const std::string& with_bom) {
  // A UTF-8 byte-order mark (editors on Windows write one) is not part of the spec, in either format.
  const std::string text = absl::StartsWith(with_bom, "\xEF\xBB\xBF") ? with_bom.substr(3) : with_bom;
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": the spec is empty (JSON or YAML, docs/job-spec.md)"));
  }
  std::string as_json = text;
  if (DetectSpecFormat(name, text) == SpecFormat::kYaml) {
    try {
      int64_t budget = kMaxYamlValues;
      const json j = YamlToJson(YAML::Load(text), budget, 0);
      if (!j.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": a YAML spec is a mapping of fields, e.g. \"steps: 20\" (docs/job-spec.md)"));
      }
      as_json = j.dump();
    } catch (const TooLarge&) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": the YAML spec expands to more than ", kMaxYamlValues, " values or ", kMaxYamlDepth,
          " levels (aliases that repeat aliases?); a job spec is far smaller: write it without such aliases"));
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": spec is not valid YAML: line ", e.mark.line + 1,
                                                     ", column ", e.mark.column + 1, ": ", e.msg));
    }
  }
  auto spec = ftd::spec::ParseTrainSpecJson(as_json);
  if (!spec.ok()) return absl::InvalidArgumentError(absl::StrCat(name, ": ", spec.status().message()));
  return spec;
}

absl::StatusOr<ftd::v1::TrainSpec> ReadSpec(const std::string& path, std::istream& in) {
  std::stringstream ss;
  if (path == "-") {
    ss << in.rdbuf();
    return ParseSpecText("stdin", ss.str());
  }
  std::ifstream f(path);
  if (!f) return absl::InvalidArgumentError(absl::StrCat("cannot read spec file ", path));
  ss << f.rdbuf();
  return ParseSpecText(path, ss.str());
}

}  // namespace ftd::client

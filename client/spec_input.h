// Reading a job spec for submit: from a file or stdin ("-"), in JSON or YAML, with its relative
// paths resolved against the caller's directory (spec/paths.h).
#pragma once

#include <istream>
#include <string>

#include "absl/status/statusor.h"
#include "ftd/v1/job_spec.pb.h"

namespace ftd::client {

enum class SpecFormat { kJson, kYaml };

// The format of a spec named `name` with text `text`: .yaml/.yml is YAML and .json JSON; otherwise
// (stdin) JSON when the first non-blank character is '{', else YAML.
SpecFormat DetectSpecFormat(const std::string& name, const std::string& text);

// Parses a spec in either format. YAML is mapped to the same JSON form (plain scalars that read as
// numbers, booleans or null become those; quoted ones stay strings), so both are checked alike.
// Errors are INVALID_ARGUMENT naming `name`, and for a syntax error its line and column. A YAML
// document whose aliases expand past 100,000 values (or 64 levels) is refused, naming `name`.
absl::StatusOr<ftd::v1::TrainSpec> ParseSpecText(const std::string& name, const std::string& text);

// Reads and parses the spec at `path` ("-": `in`, i.e. stdin).
absl::StatusOr<ftd::v1::TrainSpec> ReadSpec(const std::string& path, std::istream& in);

}  // namespace ftd::client

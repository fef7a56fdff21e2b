// The spec's file-system paths, in one list: every field that names a file or a directory. ftctl
// resolves the relative ones against the caller's directory before sending a spec, so that a spec
// means the same wherever the daemon runs.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ftd/v1/job_spec.pb.h"

namespace ftd::spec {

// Dotted JSON paths (.proto field names) of every path field of TrainSpec. A new path field goes here;
// paths_test fails for a string field named like a path (path, dir, *_path, *_dir) that is missing.
const std::vector<std::string>& SpecPathFields();

// Calls `fn` with the dotted name and the value of every set, non-empty path field, in
// SpecPathFields() order; what `fn` leaves in the string is stored. Stops at the first error.
absl::Status ForEachSpecPath(ftd::v1::TrainSpec* spec,
                             const std::function<absl::Status(const std::string& field, std::string& value)>& fn);

// Makes every set, non-empty, relative path field absolute against `base_dir` (an absolute
// directory), lexically normalized ("a/../b" -> "b"). Absolute paths are left as they are.
// INVALID_ARGUMENT when `base_dir` is not absolute.
absl::Status ResolveSpecPaths(const std::string& base_dir, ftd::v1::TrainSpec* spec);

}  // namespace ftd::spec

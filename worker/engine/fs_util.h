// Durable file writes: the building blocks of atomic checkpoints. No LibTorch.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ftd::engine {

// Writes `contents` to `path` (truncating) and fsyncs the file.
absl::Status WriteFileSynced(const std::string& path, const std::string& contents);
// fsyncs a directory, so that renames and creations inside it are durable.
absl::Status FsyncDir(const std::string& dir);
// Reads a whole file.
absl::StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace ftd::engine

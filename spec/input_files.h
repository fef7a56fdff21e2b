// The files a job's spec names, checked where the daemon accepts the job: an input that exists but
// is of the wrong type (a FIFO, a device, a socket, a directory where a file is expected, or a file
// where a directory is) is refused at submission, naming the field. Reading a FIFO with no writer
// would block the worker's training thread forever. The worker checks again when it opens each
// file (worker/engine/core/fs_util.h), since a path can change between submission and the run. An input
// that does not exist is refused too: it would fail the job only after its wait in the queue.
// Outputs that do not exist yet (the worker makes them), inputs the daemon may not look at, and
// relative paths (resolved where the worker runs) are left to the worker's check. No protobuf, no
// LibTorch.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spec/train_config.h"

namespace ftd::spec {

// "a directory", "a FIFO", "a socket", "a character device", "a block device", "a regular file".
const char* FileTypeName(mode_t mode);

// INVALID_ARGUMENT naming the first field whose existing path is of the wrong type, or whose input
// does not exist (all but spec.data.cache_dir and spec.checkpoint.dir):
//   spec.data.path              a regular file
//   spec.data.eval_path         a regular file
//   spec.data.tokenizer_path    a directory
//   spec.data.cache_dir         a directory
//   spec.model.config_path      a regular file (config.json) or a directory holding one
//   spec.model.weights_path     a directory
//   spec.lora.adapter_path      a directory
//   spec.checkpoint.dir         a directory
absl::Status CheckInputFiles(const TrainConfig& config);

// A local user a job's files are checked for: the job's owner, when its workers will not run as
// that user (with no roots configured, they open the spec's files with their own rights, root's
// included).
struct FileUser {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups, the primary one included
};

// PERMISSION_DENIED naming the first field whose path `user` could not use themself, by the files'
// modes: an input they may not read (or a directory on its way they may not search), an output whose
// nearest existing directory they may not write. Checked before CheckInputFiles, so that whether a
// file the user may not reach exists is not told either. Relative paths are left to the worker.
absl::Status CheckUserMayUse(const TrainConfig& config, const FileUser& user);

// Whether `prefix`, the first bytes of a file (`whole`: all of it), reads as JSON lines: after
// blanks (and a UTF-8 byte order mark), a JSON object that parses, or parses as far as the prefix
// goes. A token file (little-endian ids) does not: its bytes are not JSON.
bool LooksLikeJsonLines(absl::string_view prefix, bool whole);

// How many bytes LooksLikeJsonLines wants to see.
inline constexpr size_t kJsonSniffBytes = 64 << 10;

// The refusal of a token file (`field`: "spec.data.path") that holds JSON lines: it names data.format.
absl::Status JsonLinesAsTokensError(absl::string_view field, const std::string& path);

}  // namespace ftd::spec

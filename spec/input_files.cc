#include "spec/input_files.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ftd::spec {
namespace {

enum class Want { kFile, kDirectory, kFileOrDirectory };

// At most this much of a path is quoted back in a message.
constexpr size_t kQuoteMax = 200;

std::string Quote(const std::string& path) {
  if (path.size() <= kQuoteMax) return absl::StrCat("\"", path, "\"");
  return absl::StrCat("\"", absl::string_view(path).substr(0, kQuoteMax), "...\" (", path.size(), " bytes)");
}

absl::Status Check(absl::string_view field, const std::string& path, Want want, bool output) {
  if (path.empty() || path.front() != '/') return absl::OkStatus();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    // An input that is not there fails the job at its start, after its wait in the queue: refuse it
    // now. An output the worker makes; another error (a permission) the worker reports as it opens.
    if (output || (errno != ENOENT && errno != ENOTDIR)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(field, " ", Quote(path), " does not exist; give an existing ",
                                                   want == Want::kDirectory ? "directory" : "file",
                                                   " (ftctl takes a relative path against its current directory)"));
  }
  const bool file = S_ISREG(st.st_mode), dir = S_ISDIR(st.st_mode);
  const char* expected = nullptr;
  switch (want) {
    case Want::kFile: if (!file) expected = "a regular file"; break;
    case Want::kDirectory: if (!dir) expected = "a directory"; break;
    case Want::kFileOrDirectory: if (!file && !dir) expected = "a regular file or a directory"; break;
  }
  if (expected == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " ", Quote(path), " is ", FileTypeName(st.st_mode),
                                                 "; it must be ", expected));
}

// Whether `u` may `want` (4 read, 2 write, 1 search/execute) the file `st` describes, by its mode.
bool May(const FileUser& u, const struct stat& st, int want) {
  if (u.uid == 0) return true;
  int bits = st.st_mode & 7;
  if (st.st_uid == u.uid) {
    bits = (st.st_mode >> 6) & 7;
  } else if (st.st_gid == u.gid || std::find(u.groups.begin(), u.groups.end(), st.st_gid) != u.groups.end()) {
    bits = (st.st_mode >> 3) & 7;
  }
  return (bits & want) == want;
}

// Whether `u` may search every directory from / down to `dir` (an absolute, resolved path).
bool MaySearchTo(const FileUser& u, const std::string& dir) {
  // "/", "/a", "/a/b", ..., `dir`.
  for (size_t end = 0;;) {
    const std::string at = end == 0 ? "/" : dir.substr(0, end);
    struct stat st {};
    if (::stat(at.c_str(), &st) != 0 || !May(u, st, 1)) return false;
    if (end == dir.size() || dir == "/") return true;
    end = dir.find('/', end + 1);
    if (end == std::string::npos) end = dir.size();
  }
}

absl::Status Denied(absl::string_view field, const FileUser& u, const std::string& path, const char* what) {
  return absl::PermissionDeniedError(absl::StrCat(
      field, ": permission denied: ", u.name, " (uid ", u.uid, ") may not ", what, " ", Quote(path),
      "; a local user's job uses only the files its owner may, as the owner would (the workers run with other "
      "rights here, and no --user-root or --read-only-root confines them)"));
}

absl::Status CheckUse(absl::string_view field, const std::string& path, bool output, const FileUser& u) {
  if (path.empty() || path.front() != '/') return absl::OkStatus();
  // The nearest existing path at or above it, resolved (links followed, as the worker's open would).
  std::string existing = path;
  char resolved[PATH_MAX];
  while (::realpath(existing.c_str(), resolved) == nullptr) {
    const size_t slash = existing.rfind('/');
    if (slash == std::string::npos || existing == "/") return absl::OkStatus();
    existing = slash == 0 ? "/" : existing.substr(0, slash);
  }
  const std::string real = resolved;
  struct stat st {};
  if (::stat(real.c_str(), &st) != 0) return absl::OkStatus();
  const bool dir = S_ISDIR(st.st_mode);
  const std::string parent = real == "/" ? "/" : real.substr(0, std::max<size_t>(real.rfind('/'), 1));
  if (!MaySearchTo(u, dir ? real : parent)) return Denied(field, u, path, output ? "write" : "reach");
  if (existing != path) {
    // Missing below `existing`: an output is made there (it must be writable); a missing input is
    // refused by CheckInputFiles, now that its directory is known to be the user's to search.
    if (output && !May(u, st, 3)) return Denied(field, u, path, "write");
    return absl::OkStatus();
  }
  if (output) return dir && !May(u, st, 3) ? Denied(field, u, path, "write") : absl::OkStatus();
  return May(u, st, dir ? 5 : 4) ? absl::OkStatus() : Denied(field, u, path, "read");
}

}  // namespace

absl::Status CheckUserMayUse(const TrainConfig& c, const FileUser& user) {
  const struct {
    absl::string_view field;
    const std::string& path;
    bool output;
  } paths[] = {
      {"spec.data.path", c.data.path, false},
      {"spec.data.eval_path", c.data.eval_path, false},
      {"spec.data.tokenizer_path", c.data.tokenizer_path, false},
      {"spec.data.cache_dir", c.data.cache_dir, true},
      {"spec.model.config_path", c.model.config_path, false},
      {"spec.model.weights_path", c.model.weights_path, false},
      {"spec.lora.adapter_path", c.lora.adapter_path, false},
      {"spec.checkpoint.dir", c.checkpoint.dir, true},
  };
  for (const auto& p : paths) {
    if (auto st = CheckUse(p.field, p.path, p.output, user); !st.ok()) return st;
  }
  return absl::OkStatus();
}

const char* FileTypeName(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

absl::Status CheckInputFiles(const TrainConfig& c) {
  const struct {
    absl::string_view field;
    const std::string& path;
    Want want;
    bool output;  // made by the worker when missing
  } inputs[] = {
      {"spec.data.path", c.data.path, Want::kFile, false},
      {"spec.data.eval_path", c.data.eval_path, Want::kFile, false},
      {"spec.data.tokenizer_path", c.data.tokenizer_path, Want::kDirectory, false},
      {"spec.data.cache_dir", c.data.cache_dir, Want::kDirectory, true},
      {"spec.model.config_path", c.model.config_path, Want::kFileOrDirectory, false},
      {"spec.model.weights_path", c.model.weights_path, Want::kDirectory, false},
      {"spec.lora.adapter_path", c.lora.adapter_path, Want::kDirectory, false},
      {"spec.checkpoint.dir", c.checkpoint.dir, Want::kDirectory, true},
  };
  for (const auto& in : inputs) {
    if (auto st = Check(in.field, in.path, in.want, in.output); !st.ok()) return st;
  }
  return absl::OkStatus();
}

namespace {

// Parses JSON and remembers whether it failed only because the input ended.
struct JsonSniffer : nlohmann::json_sax<nlohmann::json> {
  size_t size = 0;
  bool cut = false;  // the only error: the input ended in the middle of the value
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) override {
    cut = position >= size;
    return false;
  }
};

}  // namespace

bool LooksLikeJsonLines(absl::string_view prefix, bool whole) {
  if (absl::StartsWith(prefix, "\xEF\xBB\xBF")) prefix.remove_prefix(3);
  const size_t b = prefix.find_first_not_of(" \t\r\n");
  if (b == absl::string_view::npos || prefix[b] != '{') return false;
  absl::string_view line = prefix.substr(b);
  const size_t nl = line.find('\n');
  const bool complete = nl != absl::string_view::npos || whole;
  if (nl != absl::string_view::npos) line = line.substr(0, nl);
  JsonSniffer sax;
  sax.size = line.size();
  try {
    if (nlohmann::json::sax_parse(line.begin(), line.end(), &sax)) return true;
  } catch (const nlohmann::json::exception&) {
    return false;  // a number out of range: not worth telling apart
  }
  return sax.cut && !complete;
}

absl::Status JsonLinesAsTokensError(absl::string_view field, const std::string& path) {
  return absl::InvalidArgumentError(absl::StrCat(
      field, " ", Quote(path), " holds JSON lines, not token ids (data.format is \"tokens\", the default): set "
      "data.format to \"text\", \"prompt_completion\" or \"chat\" to tokenize it with the model's tokenizer "
      "(docs/data-format.md)"));
}

}  // namespace ftd::spec

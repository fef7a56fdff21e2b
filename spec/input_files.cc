#include "spec/input_files.h"

#include <sys/stat.h>

#include <cerrno>
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

}  // namespace

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

#include "server/requests/input_contents.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spec/input_files.h"
#include "spec/jsonl_example.h"
#include "spec/lora_config.h"
#include "util/unique_fd.h"

namespace ftd::server {
namespace fs = std::filesystem;

namespace {

// Up to `max` bytes from the start of the regular file `path`, and its size; nullopt if it cannot be
// read (the worker reports why).
struct Head {
  std::string bytes;
  int64_t size = 0;
};
std::optional<Head> ReadHead(const std::string& path, int64_t max) {
  // O_NONBLOCK: a FIFO swapped in since the type check must not hang the daemon.
  util::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  struct stat st {};
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  Head h;
  h.size = st.st_size;
  h.bytes.resize(static_cast<size_t>(std::min<int64_t>(max, st.st_size)));
  size_t got = 0;
  while (got < h.bytes.size()) {
    const ssize_t n = ::pread(fd.get(), h.bytes.data() + got, h.bytes.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  h.bytes.resize(got);
  return h;
}

std::string Size(int64_t b) {
  if (b >= (int64_t{1} << 30)) return absl::StrFormat("%.1f GiB", static_cast<double>(b) / (int64_t{1} << 30));
  if (b >= (int64_t{1} << 20)) return absl::StrFormat("%.1f MiB", static_cast<double>(b) / (1 << 20));
  return absl::StrFormat("%d bytes", b);
}

spec::JsonlLayout LayoutOf(const spec::DataConfig& d) {
  spec::JsonlLayout l;
  if (d.format == "text") {
    l.kind = spec::JsonlKind::kText;
  } else if (d.format == "prompt_completion") {
    l.kind = spec::JsonlKind::kPromptCompletion;
  } else {
    l.kind = spec::JsonlKind::kChat;
  }
  l.text_field = d.text_field;
  l.prompt_field = d.prompt_field;
  l.completion_field = d.completion_field;
  l.messages_field = d.messages_field;
  l.role_field = d.role_field;
  l.content_field = d.content_field;
  return l;
}

// A JSONL file's lines, or as many whole lines as fit in the first `max` bytes.
absl::Status CheckJsonl(const std::string& field, const std::string& path, const spec::DataConfig& d,
                        const InputContentOptions& o, std::vector<std::string>* notes) {
  auto head = ReadHead(path, o.jsonl_check_bytes);
  if (!head.has_value()) return absl::OkStatus();
  const bool whole = static_cast<int64_t>(head->bytes.size()) == head->size;
  absl::string_view text = head->bytes;
  if (!whole) {
    const size_t last = text.rfind('\n');
    text = text.substr(0, last == absl::string_view::npos ? 0 : last + 1);
  }
  const spec::JsonlLayout layout = LayoutOf(d);
  int64_t lines = 0, bad = 0, usable = 0;
  std::string first_bad;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    absl::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == absl::string_view::npos ? text.size() : nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    ++lines;
    auto doc = spec::ParseJsonlLine(line);
    absl::Status st = doc.status();
    if (doc.ok()) st = spec::ReadJsonlExample(*doc, layout).status();
    if (st.ok()) {
      ++usable;
      continue;
    }
    if (++bad <= 5) {
      absl::StrAppend(&first_bad, bad == 1 ? ": " : "; ", "line ", lines, o.may_quote ? absl::StrCat(": ", st.message()) : "");
    }
  }
  const std::string span =
      whole ? absl::StrCat("all ", lines, " lines of ", path)
            : absl::StrCat("the first ", lines, " lines of ", path, " (", Size(static_cast<int64_t>(head->bytes.size())),
                           " of ", Size(head->size), "; the job checks the rest when it starts)");
  if (bad > 0 && d.on_bad_line != "skip") {
    return spec::BadLinesError(absl::StrCat(bad, " bad line", bad == 1 ? "" : "s", " in ", span, first_bad,
                                            bad > 5 ? "; ..." : ""));
  }
  if (whole && usable == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, " has no usable example"));
  }
  notes->push_back(absl::StrCat(field, ": checked ", span, ": ", usable, " example(s)",
                                bad > 0 ? absl::StrCat(", ", bad, " bad line(s) to skip (data.on_bad_line \"skip\")") : ""));
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckInputContents(const spec::TrainConfig& c, const InputContentOptions& o,
                                std::vector<std::string>* notes) {
  for (const auto& [field, path] : {std::pair<std::string, std::string>{"spec.data.path", c.data.path},
                                    {"spec.data.eval_path", c.data.eval_path}}) {
    if (path.empty() || path.front() != '/') continue;
    if (!c.data.jsonl()) {
      auto head = ReadHead(path, static_cast<int64_t>(spec::kJsonSniffBytes));
      if (head.has_value() && spec::LooksLikeJsonLines(head->bytes, static_cast<int64_t>(head->bytes.size()) == head->size)) {
        return spec::JsonLinesAsTokensError(field, path);
      }
      continue;
    }
    if (auto st = CheckJsonl(field, path, c.data, o, notes); !st.ok()) return st;
  }
  if (c.lora.enabled && !c.lora.adapter_path.empty() && c.lora.adapter_path.front() == '/') {
    const std::string config = (fs::path(c.lora.adapter_path) / "adapter_config.json").string();
    if (auto head = ReadHead(config, 1 << 20); head.has_value()) {
      if (auto st = spec::CheckPeftAdapter(head->bytes, config, c.lora); !st.ok()) return st;
      notes->push_back(absl::StrCat("spec.lora.adapter_path: ", config, " is a LoRA adapter this spec trains"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ftd::server

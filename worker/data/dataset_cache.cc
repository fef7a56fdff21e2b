#include "worker/data/dataset_cache.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "worker/data/confined_open.h"

namespace ftd::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Bumped whenever the tokenized result of the same inputs changes (rendering, masking, layout).
constexpr int kCacheVersion = 1;

absl::Status WriteSynced(const std::string& path, const void* data, size_t size) {
  const int fd = OpenConfined(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644, /*write=*/true);
  if (fd < 0) return absl::InternalError(OpenError("", "cannot create", path, errno, /*write=*/true));
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!synced) return absl::InternalError(absl::StrCat("cannot sync ", path, ": ", std::strerror(err)));
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = OpenConfined(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0, /*write=*/false);
  if (fd < 0) return absl::InternalError(OpenError("", "cannot open", dir, errno, /*write=*/false));
  ::fsync(fd);
  ::close(fd);
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<std::vector<T>> ReadArray(const std::string& path) {
  auto f = MappedFile::Open(path);
  if (!f.ok()) return f.status();
  const std::string_view c = f->contents();
  if (c.size() % sizeof(T) != 0) {
    return absl::DataLossError(absl::StrCat(path, " has ", c.size(), " bytes, not a multiple of ", sizeof(T)));
  }
  std::vector<T> out(c.size() / sizeof(T));
  if (!c.empty()) std::memcpy(out.data(), c.data(), c.size());
  return out;
}

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr); }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  // Length-prefixed, so two inputs can never run together into the same bytes.
  void Add(std::string_view part) {
    const uint64_t n = part.size();
    EVP_DigestUpdate(ctx_, &n, sizeof(n));
    EVP_DigestUpdate(ctx_, part.data(), part.size());
  }
  std::string Hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_, md, &len);
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    for (unsigned int i = 0; i < len; ++i) {
      out.push_back(kHex[md[i] >> 4]);
      out.push_back(kHex[md[i] & 15]);
    }
    return out;
  }

 private:
  EVP_MD_CTX* ctx_;
};

}  // namespace

std::string DefaultCacheDir() {
  if (const char* d = std::getenv("FTD_DATA_CACHE"); d != nullptr && *d != '\0') return d;
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') return absl::StrCat(h, "/.cache/ftd/data");
  return "/tmp/ftd-data-cache";
}

absl::StatusOr<std::string> CacheKey(const PrepareRequest& r) {
  Sha256 h;
  h.Add(absl::StrCat("ftd-dataset-v", kCacheVersion));
  h.Add(r.format.Describe());
  auto data = MappedFile::Open(r.path);
  if (!data.ok()) return absl::Status(data.status().code(), absl::StrCat("spec.data.path: ", data.status().message()));
  h.Add(data->contents());
  auto tok = MappedFile::Open(r.tokenizer_dir + "/tokenizer.json");
  if (!tok.ok()) {
    return absl::Status(tok.status().code(), absl::StrCat("spec.data.tokenizer_path: ", tok.status().message()));
  }
  h.Add(tok->contents());
  auto c = MappedFile::Open(r.tokenizer_dir + "/tokenizer_config.json");  // optional
  if (c.ok()) {
    h.Add(c->contents());
  } else if (absl::IsNotFound(c.status())) {
    h.Add("");
  } else {
    return absl::Status(c.status().code(), absl::StrCat("spec.data.tokenizer_path: ", c.status().message()));
  }
  return h.Hex();
}

absl::Status WriteCorpus(const std::string& dir, const Corpus& c) {
  const std::string tmp = absl::StrCat(dir, ".tmp-", ::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (auto st = EnsureDirectory(tmp, ""); !st.ok()) return st;
  json meta = {{"version", kCacheVersion},
               {"ids", c.ids.size()},
               {"documents", c.num_docs()},
               {"loss_tokens", c.loss_tokens()},
               {"lines", c.lines},
               {"bad_line_count", c.bad_line_count},
               {"bad_lines", c.bad_lines_summary}};
  const std::string meta_text = meta.dump(2) + "\n";
  absl::Status st = WriteSynced(tmp + "/ids.u32", c.ids.data(), c.ids.size() * sizeof(uint32_t));
  if (st.ok()) st = WriteSynced(tmp + "/loss.u8", c.loss.data(), c.loss.size());
  if (st.ok()) st = WriteSynced(tmp + "/docs.u64", c.docs.data(), c.docs.size() * sizeof(uint64_t));
  if (st.ok()) st = WriteSynced(tmp + "/meta.json", meta_text.data(), meta_text.size());  // last: complete
  if (st.ok()) st = SyncDir(tmp);
  if (st.ok()) {
    fs::rename(tmp, dir, ec);
    // Another writer got there first with the same key: its entry holds the same corpus.
    if (ec && fs::exists(dir + "/meta.json")) ec.clear();
    if (ec) st = absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", dir, ": ", ec.message()));
  }
  if (st.ok()) st = SyncDir(fs::path(dir).parent_path().string());
  fs::remove_all(tmp, ec);
  return st;
}

absl::StatusOr<Corpus> ReadCorpus(const std::string& dir) {
  auto meta_file = MappedFile::Open(dir + "/meta.json");
  if (!meta_file.ok()) return meta_file.status();
  const json meta = json::parse(meta_file->contents(), nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object() || meta.value("version", 0) != kCacheVersion) {
    return absl::DataLossError(absl::StrCat(dir, "/meta.json is not a version ", kCacheVersion, " cache entry"));
  }
  Corpus c;
  auto ids = ReadArray<uint32_t>(dir + "/ids.u32");
  if (!ids.ok()) return ids.status();
  auto loss = ReadArray<uint8_t>(dir + "/loss.u8");
  if (!loss.ok()) return loss.status();
  auto docs = ReadArray<uint64_t>(dir + "/docs.u64");
  if (!docs.ok()) return docs.status();
  c.ids = *std::move(ids);
  c.loss = *std::move(loss);
  c.docs = *std::move(docs);
  if (c.loss.size() != c.ids.size() || c.docs.empty() || c.docs.front() != 0 || c.docs.back() != c.ids.size() ||
      !std::is_sorted(c.docs.begin(), c.docs.end())) {
    return absl::DataLossError(absl::StrCat(dir, " is inconsistent (ids, loss and docs disagree); delete it"));
  }
  c.lines = meta.value("lines", uint64_t{0});
  c.bad_line_count = meta.value("bad_line_count", uint64_t{0});
  c.bad_lines_summary = meta.value("bad_lines", std::string());
  return c;
}

absl::StatusOr<Prepared> PrepareJsonl(const PrepareRequest& r) {
  auto key = CacheKey(r);
  if (!key.ok()) return key.status();
  const std::string root = r.cache_dir.empty() ? DefaultCacheDir() : r.cache_dir;
  Prepared out;
  out.dir = absl::StrCat(root, "/", *key);
  if (fs::exists(out.dir + "/meta.json")) {
    auto c = ReadCorpus(out.dir);
    if (c.ok()) {
      // The same inputs give the same bad lines; refusing them is not the cache's business.
      if (c->bad_line_count > 0 && !r.format.skip_bad_lines) {
        return BadLinesError(c->bad_lines_summary);
      }
      out.corpus = *std::move(c);
      out.reused = true;
      return out;
    }
    // A damaged entry is tokenized again and replaced.
    std::error_code ec;
    fs::remove_all(out.dir, ec);
  }
  auto tok = Tokenizer::LoadDir(r.tokenizer_dir);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(), absl::StrCat("spec.data.tokenizer_path: ", tok.status().message()));
  }
  auto file = MappedFile::Open(r.path);
  if (!file.ok()) return absl::Status(file.status().code(), absl::StrCat("spec.data.path: ", file.status().message()));
  // Bad lines are stored too (skipped, with their summary), so a refusing job and a skipping job
  // share the entry.
  JsonlFormat keep = r.format;
  keep.skip_bad_lines = true;
  auto corpus = TokenizeJsonl(**tok, file->contents(), keep, r.path, r.parallel);
  if (!corpus.ok()) return corpus.status();
  // A cache that cannot be written costs the next job a tokenization, not this one its run.
  if (auto s = EnsureDirectory(root, "spec.data.cache_dir"); !s.ok()) {
    out.cache_error = std::string(s.message());
  } else if (auto s = WriteCorpus(out.dir, *corpus); !s.ok()) {
    out.cache_error = absl::StrCat("spec.data.cache_dir: ", s.message());
  }
  if (!out.cache_error.empty()) out.dir.clear();
  if (corpus->bad_line_count > 0 && !r.format.skip_bad_lines) {
    return BadLinesError(corpus->bad_lines_summary);
  }
  out.corpus = *std::move(corpus);
  return out;
}

}  // namespace ftd::data

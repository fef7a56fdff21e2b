#include "worker/data/dataset_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "util/dir_tree.h"
#include "util/unique_fd.h"
#include "worker/data/confined_open.h"

namespace ftd::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Bumped whenever the tokenized result of the same inputs changes (rendering, masking, layout).
constexpr int kCacheVersion = 1;

using util::Fd;

absl::Status Errno(const char* what, const std::string& path) {
  return absl::InternalError(absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno)));
}

// Creates the file `name` (which must not exist) in the open directory `dir`, never through a link,
// writes `data` and syncs it; `path` names it in errors.
absl::Status WriteSyncedAt(int dir, const std::string& name, const std::string& path, const void* data,
                           size_t size) {
  Fd fd(::openat(dir, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (fd.get() < 0) return Errno("create", path);
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd.get(), p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("write", path);
    p += n;
    size -= static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return Errno("sync", path);
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<std::vector<T>> ReadArrayAt(int dir, const std::string& name, const std::string& path) {
  auto f = MappedFile::OpenAt(dir, name, path);
  if (!f.ok()) return f.status();
  const std::string_view c = f->contents();
  if (c.size() % sizeof(T) != 0) {
    return absl::DataLossError(absl::StrCat(path, " has ", c.size(), " bytes, not a multiple of ", sizeof(T)));
  }
  std::vector<T> out(c.size() / sizeof(T));
  if (!c.empty()) std::memcpy(out.data(), c.data(), c.size());
  return out;
}

// The directory `dir`, opened as the worker's other opens are (beneath the job's roots when
// confined; a writable one when `write`). -1 with errno set.
int OpenDir(const std::string& dir, bool write) {
  return OpenConfined(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0, write);
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

absl::Status WriteCorpusAt(int root, const std::string& name, const std::string& dir, const Corpus& c) {
  const std::string tmp_name = absl::StrCat(name, ".tmp-", ::getpid());
  const std::string tmp = absl::StrCat(dir, ".tmp-", ::getpid());
  int64_t freed = 0;
  // A dead writer's leftover with this pid; removed beneath `root`, links not followed.
  if (auto st = util::RemoveEntryAt(root, tmp_name, tmp, &freed); !st.ok()) return st;
  if (::mkdirat(root, tmp_name.c_str(), 0700) != 0) return Errno("create", tmp);
  absl::Status st;
  {
    Fd t(::openat(root, tmp_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (t.get() < 0) st = Errno("open", tmp);
    json meta = {{"version", kCacheVersion},
                 {"ids", c.ids.size()},
                 {"documents", c.num_docs()},
                 {"loss_tokens", c.loss_tokens()},
                 {"lines", c.lines},
                 {"bad_line_count", c.bad_line_count},
                 {"bad_lines", c.bad_lines_summary}};
    const std::string meta_text = meta.dump(2) + "\n";
    auto write = [&](const char* file, const void* data, size_t size) {
      if (st.ok()) st = WriteSyncedAt(t.get(), file, absl::StrCat(tmp, "/", file), data, size);
    };
    write("ids.u32", c.ids.data(), c.ids.size() * sizeof(uint32_t));
    write("loss.u8", c.loss.data(), c.loss.size());
    write("docs.u64", c.docs.data(), c.docs.size() * sizeof(uint64_t));
    write("meta.json", meta_text.data(), meta_text.size());  // last: complete
    if (st.ok() && ::fsync(t.get()) != 0) st = Errno("sync", tmp);
  }
  if (st.ok() && ::renameat(root, tmp_name.c_str(), root, name.c_str()) != 0) {
    st = absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", dir, ": ", std::strerror(errno)));
    // Another writer got there first with the same key: its entry holds the same corpus.
    Fd e(::openat(root, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (e.get() >= 0 && ::faccessat(e.get(), "meta.json", F_OK, AT_SYMLINK_NOFOLLOW) == 0) st = absl::OkStatus();
  }
  if (st.ok() && ::fsync(root) != 0) st = Errno("sync", dir);
  (void)util::RemoveEntryAt(root, tmp_name, tmp, &freed);  // gone after the rename; left when it failed
  return st;
}

absl::StatusOr<Corpus> ReadCorpusAt(int root, const std::string& name, const std::string& dir) {
  Fd e(::openat(root, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (e.get() < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no cache entry ", dir));
    if (errno == ELOOP || errno == ENOTDIR) {
      return absl::DataLossError(absl::StrCat(dir, " is not a directory (a symbolic link is never followed)"));
    }
    return Errno("open", dir);
  }
  const std::string meta_path = dir + "/meta.json";
  auto meta_file = MappedFile::OpenAt(e.get(), "meta.json", meta_path);
  if (!meta_file.ok()) {  // an entry without its meta.json is not whole
    return absl::DataLossError(std::string(meta_file.status().message()));
  }
  const json meta = json::parse(meta_file->contents(), nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object() || meta.value("version", 0) != kCacheVersion) {
    return absl::DataLossError(absl::StrCat(meta_path, " is not a version ", kCacheVersion, " cache entry"));
  }
  Corpus c;
  auto ids = ReadArrayAt<uint32_t>(e.get(), "ids.u32", dir + "/ids.u32");
  if (!ids.ok()) return ids.status();
  auto loss = ReadArrayAt<uint8_t>(e.get(), "loss.u8", dir + "/loss.u8");
  if (!loss.ok()) return loss.status();
  auto docs = ReadArrayAt<uint64_t>(e.get(), "docs.u64", dir + "/docs.u64");
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

// Why the cache directory open as `fd` must not be used, or "" when it may: entries anyone could
// have put there are not read (a job would train on them), and a default location is ours alone.
std::string Untrusted(int fd, const std::string& dir, bool default_location) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return absl::StrCat("cannot inspect ", dir, ": ", std::strerror(errno));
  if ((st.st_mode & S_IWOTH) != 0) {
    return absl::StrFormat(
        "%s is writable by every user (mode %04o), so its entries could be anyone's; the cache is not used "
        "(chmod o-w %s, or choose another data.cache_dir)",
        dir, st.st_mode & 07777, dir);
  }
  if (default_location && st.st_uid != ::geteuid()) {
    return absl::StrCat(dir, " belongs to uid ", st.st_uid, ", not to this worker's uid ", ::geteuid(),
                        "; the cache is not used (set data.cache_dir, or FTD_DATA_CACHE)");
  }
  return "";
}

}  // namespace

std::string DefaultCacheDir() {
  if (const char* d = std::getenv("FTD_DATA_CACHE"); d != nullptr && *d != '\0') return d;
  // A service user's HOME may name no directory (/nonexistent): its own directory in /tmp then.
  struct stat st {};
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0' && ::stat(h, &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::StrCat(h, "/.cache/ftd/data");
  }
  return absl::StrCat("/tmp/ftd-data-cache-", ::geteuid());
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
  const fs::path p(dir);
  const std::string parent = p.parent_path().string();
  if (auto st = EnsureDirectory(parent, ""); !st.ok()) return st;
  Fd root(OpenDir(parent, /*write=*/true));
  if (root.get() < 0) return absl::PermissionDeniedError(OpenError("", "cannot open", parent, errno, true));
  return WriteCorpusAt(root.get(), p.filename().string(), dir, c);
}

absl::StatusOr<Corpus> ReadCorpus(const std::string& dir) {
  const fs::path p(dir);
  const std::string parent = p.parent_path().string();
  Fd root(OpenDir(parent, /*write=*/false));
  if (root.get() < 0) {
    const int e = errno;
    const std::string msg = OpenError("", "cannot open", parent, e, false);
    return e == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  return ReadCorpusAt(root.get(), p.filename().string(), dir);
}

absl::StatusOr<Prepared> PrepareJsonl(const PrepareRequest& r) {
  auto key = CacheKey(r);
  if (!key.ok()) return key.status();
  const bool default_location = r.cache_dir.empty();
  const std::string root = default_location ? DefaultCacheDir() : r.cache_dir;
  Prepared out;
  out.dir = absl::StrCat(root, "/", *key);
  // Every look into the cache is beneath its opened directory: the entry and its files are opened
  // with O_NOFOLLOW, a damaged entry removed by unlinkat, the new one renamed by renameat, so a link
  // swapped in between these steps is never followed (util/dir_tree.h).
  bool usable = true;
  if (Fd dir(OpenDir(root, /*write=*/false)); dir.get() >= 0) {
    if (std::string why = Untrusted(dir.get(), root, default_location); !why.empty()) {
      out.cache_error = absl::StrCat("spec.data.cache_dir: ", why);
      usable = false;
    } else {
      auto c = ReadCorpusAt(dir.get(), *key, out.dir);
      if (c.ok()) {
        // The same inputs give the same bad lines; refusing them is not the cache's business.
        if (c->bad_line_count > 0 && !r.format.skip_bad_lines) {
          return spec::BadLinesError(Av(c->bad_lines_summary));
        }
        out.corpus = *std::move(c);
        out.reused = true;
        return out;
      }
      if (!absl::IsNotFound(c.status())) {  // a damaged entry is tokenized again and replaced
        int64_t freed = 0;
        (void)util::RemoveEntryAt(dir.get(), *key, out.dir, &freed);
      }
    }
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
  if (!usable) {  // out.cache_error says why
  } else if (auto s = EnsureDirectory(root, "spec.data.cache_dir"); !s.ok()) {
    out.cache_error = std::string(s.message());
  } else if (Fd dir(OpenDir(root, /*write=*/true)); dir.get() < 0) {
    out.cache_error = OpenError("spec.data.cache_dir", "cannot open", root, errno, /*write=*/true);
  } else if (std::string why = Untrusted(dir.get(), root, default_location); !why.empty()) {
    out.cache_error = absl::StrCat("spec.data.cache_dir: ", why);
  } else if (auto s = WriteCorpusAt(dir.get(), *key, out.dir, *corpus); !s.ok()) {
    out.cache_error = absl::StrCat("spec.data.cache_dir: ", s.message());
  }
  if (!out.cache_error.empty()) out.dir.clear();
  if (corpus->bad_line_count > 0 && !r.format.skip_bad_lines) {
    return spec::BadLinesError(Av(corpus->bad_lines_summary));
  }
  out.corpus = *std::move(corpus);
  return out;
}

}  // namespace ftd::data

#include "spec/sandbox.h"

#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "spec/paths.h"

namespace ftd::spec {
namespace {

namespace fs = std::filesystem;

constexpr char kUser[] = "{user}";

std::string List(const Roots& roots, bool write) {
  std::vector<std::string> all;
  if (!roots.writable.empty()) all.push_back(roots.writable);
  if (!write) all.insert(all.end(), roots.read_only.begin(), roots.read_only.end());
  return all.empty() ? std::string("none") : absl::StrJoin(all, ", ");
}

}  // namespace

absl::Status SandboxConfig::Validate() {
  if (!user_root.empty()) {
    if (user_root.front() != '/' || user_root.find(kUser) == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("--user-root \"", user_root,
                                                     "\" must be an absolute pattern holding {user}, e.g. "
                                                     "/srv/ftd/users/{user}"));
    }
  }
  for (std::string& root : read_only_roots) {
    std::error_code ec;
    const fs::path p = fs::canonical(root, ec);
    if (ec || !fs::is_directory(p, ec)) {
      return absl::InvalidArgumentError(absl::StrCat("--read-only-root \"", root, "\" is not an existing directory",
                                                     ec ? absl::StrCat(" (", ec.message(), ")") : ""));
    }
    root = p.string();
  }
  return absl::OkStatus();
}

absl::StatusOr<Roots> SandboxConfig::RootsFor(const std::string& user) const {
  Roots r;
  r.read_only = read_only_roots;
  if (user_root.empty()) return r;
  if (user.empty() || user == "." || user == ".." || user.find('/') != std::string::npos ||
      user.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("user \"", user, "\" cannot name a directory under --user-root"));
  }
  auto root = ResolvePath(absl::StrReplaceAll(user_root, {{kUser, user}}));
  if (!root.ok()) return root.status();
  r.writable = *root;
  return r;
}

absl::StatusOr<std::string> ResolvePath(const std::string& path) {
  // weakly_canonical resolves the longest existing prefix and appends the rest lexically; a `..` in
  // that rest can climb back into existing directories, whose links the next round resolves.
  fs::path p(path);
  for (int round = 0; round < 40; ++round) {
    std::error_code ec;
    fs::path next = fs::weakly_canonical(p, ec);
    if (ec) return absl::PermissionDeniedError("not permitted");
    if (next == p) return next.string();
    p = std::move(next);
  }
  return absl::PermissionDeniedError("not permitted (too many levels of symbolic links)");
}

bool Beneath(const std::string& path, const std::string& root) {
  if (root == "/") return !path.empty() && path.front() == '/';
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

bool IsOutputField(const std::string& dotted) { return dotted == "checkpoint.dir" || dotted == "data.cache_dir"; }

absl::Status ConfineSpecPaths(const Roots& roots, ftd::v1::TrainSpec* spec) {
  return ForEachSpecPath(spec, [&](const std::string& field, std::string& value) -> absl::Status {
    const std::string name = absl::StrCat("spec.", field);
    const bool output = IsOutputField(field);
    std::string absolute = value;
    if (value.front() != '/') {
      if (roots.writable.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(name, " \"", value, "\" is relative and you have no root "
                                                       "directory to take it against; give an absolute path under ",
                                                       List(roots, output)));
      }
      absolute = (fs::path(roots.writable) / value).string();
    }
    auto resolved = ResolvePath(absolute);
    if (!resolved.ok()) return absl::PermissionDeniedError(absl::StrCat(name, ": not permitted: \"", value, "\""));
    bool inside = !roots.writable.empty() && Beneath(*resolved, roots.writable);
    for (const std::string& r : roots.read_only) inside = inside || (!output && Beneath(*resolved, r));
    if (!inside) {
      const bool moved = fs::path(absolute).lexically_normal() != fs::path(*resolved);
      return absl::PermissionDeniedError(absl::StrCat(
          name, ": not permitted: \"", value, "\"", moved ? " (once `..` and symbolic links are followed)" : "",
          " is outside the directories you may ", output ? "write" : "read", ": ", List(roots, output)));
    }
    if (!output) {
      struct stat st {};
      if (::stat(resolved->c_str(), &st) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(name, " \"", value, "\" does not exist (",
                                                       errno == ENOENT ? "give an existing path" : "not permitted",
                                                       ")"));
      }
    }
    value = *resolved;
    return absl::OkStatus();
  });
}

}  // namespace ftd::spec

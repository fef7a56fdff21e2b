// What every ftctl command shares (context.h): how errors are printed and the exit codes, the address
// a user typed made a gRPC target, and the connection options resolved from the flags, the
// environment and the config file's contexts (with the token read from its file). Interrupts are in
// interrupt.cc.
#include "client/context.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/render.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace ftd::client {

namespace fs = std::filesystem;

int Fail(const absl::Status& st) {
  if (Interrupted()) {
    std::cerr << "ftctl: interrupted" << std::endl;
    return kExitInterrupted;
  }
  std::cerr << "ftctl: " << absl::StatusCodeToString(st.code()) << ": " << Shown(st.message()) << std::endl;
  return kExitCallFailed;
}

int Usage(const std::string& msg) {
  std::cerr << "ftctl: " << Shown(msg) << std::endl;
  return kExitUsage;
}

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

absl::StatusOr<std::string> NormalizeAddress(const std::string& addr) {
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("address \"", addr, "\" ", why,
                                                   " (e.g. localhost, gpu-box:7070, [::1]:7070 or unix:/run/ftd.sock)"));
  };
  if (addr.empty()) return bad("is empty");
  for (const char* scheme : {"unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:"}) {
    if (absl::StartsWith(addr, scheme)) return addr;
  }
  if (absl::StrContains(addr, "://")) return addr;
  std::string host, port;
  if (addr.front() == '[') {
    const auto close = addr.find(']');
    if (close == std::string::npos) return bad("has no closing ]");
    host = addr.substr(0, close + 1);
    const std::string rest = addr.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return bad("has something other than :PORT after ]");
    if (!rest.empty()) port = rest.substr(1);
    if (rest.empty()) port = absl::StrCat(kDefaultPort);
  } else if (const auto colons = std::count(addr.begin(), addr.end(), ':'); colons == 0) {
    host = addr;
    port = absl::StrCat(kDefaultPort);
  } else if (colons == 1) {
    host = addr.substr(0, addr.find(':'));
    port = addr.substr(addr.find(':') + 1);
  } else {
    host = absl::StrCat("[", addr, "]");  // a bare IPv6 address: it cannot carry a port
    port = absl::StrCat(kDefaultPort);
  }
  if (host.empty() || host == "[]") return bad("names no host");
  int p = 0;
  if (!absl::SimpleAtoi(port, &p) || p < 1 || p > 65535) return bad("has no valid port (1..65535)");
  return absl::StrCat(host, ":", p);
}

std::string ConfigPath() {
  if (const char* p = std::getenv("FTCTL_CONFIG"); p != nullptr && *p != '\0') return p;
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x != nullptr && *x != '\0') return std::string(x) + "/ftd/ftctl.json";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') return std::string(h) + "/.config/ftd/ftctl.json";
  return "";
}

namespace {

// What the config file says (docs/ftctl.md).
struct Config {
  std::string path;  // "" when there is none
  std::string addr;  // of the chosen context, else the file's top-level addr
  double timeout_s = 0;
  std::string context;
  bool tls = false;
  std::string ca_file, cert_file, key_file, token_file;
};

absl::Status BadConfig(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": ", why));
}

// A file named in the config: relative to the config file's folder.
std::string Near(const std::string& config, const std::string& file) {
  if (file.empty() || fs::path(file).is_absolute()) return file;
  return (fs::path(config).parent_path() / file).string();
}

absl::Status ReadContext(const std::string& path, const std::string& name, const nlohmann::json& c, Config* out) {
  if (!c.is_object()) return BadConfig(path, absl::StrCat("context \"", name, "\" is not an object"));
  for (auto it = c.begin(); it != c.end(); ++it) {
    const std::string& k = it.key();
    if (k == "tls" && it->is_boolean()) {
      out->tls = it->get<bool>();
    } else if (it->is_string() && (k == "addr" || k == "ca_file" || k == "cert_file" || k == "key_file" ||
                                   k == "token_file")) {
      const std::string v = it->get<std::string>();
      if (k == "addr") out->addr = v;
      if (k == "ca_file") out->ca_file = Near(path, v);
      if (k == "cert_file") out->cert_file = Near(path, v);
      if (k == "key_file") out->key_file = Near(path, v);
      if (k == "token_file") out->token_file = Near(path, v);
    } else {
      return BadConfig(path, absl::StrCat("context \"", name, "\": unknown or invalid key \"", k,
                                          "\" (known: addr, ca_file, cert_file, key_file, token_file (strings), "
                                          "tls (true/false))"));
    }
  }
  out->tls = out->tls || !out->ca_file.empty() || !out->cert_file.empty();
  return absl::OkStatus();
}

// Reads the config file if there is one and picks the context: `wanted` (--context), else
// $FTD_CONTEXT, else the file's current_context. A file named by $FTCTL_CONFIG must exist.
absl::StatusOr<Config> LoadConfig(const std::string& wanted) {
  Config cfg;
  const std::string path = ConfigPath();
  const char* env_path = std::getenv("FTCTL_CONFIG");
  const bool named = env_path != nullptr && *env_path != '\0';
  std::string want = wanted, want_source = "--context";
  if (want.empty()) {
    if (const char* e = std::getenv("FTD_CONTEXT"); e != nullptr && *e != '\0') {
      want = e;
      want_source = "$FTD_CONTEXT";
    }
  }
  std::error_code ec;
  if (path.empty() || (!named && !fs::exists(path, ec))) {
    if (!want.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(want_source, " names context \"", want, "\" but there is no config file (",
                                                     path.empty() ? "set $FTCTL_CONFIG" : path, ")"));
    }
    return cfg;
  }
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("config file ", path, " (from $FTCTL_CONFIG) cannot be read: ",
                                                   fs::exists(path, ec) ? "permission denied" : "it does not exist"));
  }
  cfg.path = path;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return BadConfig(path, "is not a JSON object such as {\"addr\": \"host:7070\"} or {\"current_context\": \"lab\", "
                           "\"contexts\": {\"lab\": {\"addr\": \"host:7070\", \"ca_file\": \"ca.pem\"}}}");
  }
  const nlohmann::json* contexts = nullptr;
  std::string current;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "addr" && it->is_string()) {
      cfg.addr = it->get<std::string>();
    } else if (it.key() == "timeout_s" && it->is_number() && it->get<double>() > 0) {
      cfg.timeout_s = it->get<double>();
    } else if (it.key() == "current_context" && it->is_string()) {
      current = it->get<std::string>();
    } else if (it.key() == "contexts" && it->is_object()) {
      contexts = &*it;
    } else {
      return BadConfig(path, absl::StrCat("unknown or invalid key \"", it.key(),
                                          "\" (known: \"addr\" (string), \"timeout_s\" (number > 0), "
                                          "\"current_context\" (string), \"contexts\" (object))"));
    }
  }
  if (want.empty()) {
    want = current;
    want_source = "current_context";
  }
  if (want.empty()) return cfg;
  if (contexts == nullptr || !contexts->contains(want)) {
    std::string known;
    if (contexts != nullptr) {
      for (auto it = contexts->begin(); it != contexts->end(); ++it) absl::StrAppend(&known, known.empty() ? "" : ", ", it.key());
    }
    return BadConfig(path, absl::StrCat(want_source, " names context \"", want, "\", which it does not have (it has: ",
                                        known.empty() ? "none" : known, ")"));
  }
  cfg.context = want;
  cfg.addr.clear();
  if (auto st = ReadContext(path, want, contexts->at(want), &cfg); !st.ok()) return st;
  return cfg;
}

// ssh refuses a private key that group or others may read; a token file that loose gets a one-line
// warning instead (docs/security.md): secret mounts (Kubernetes, Docker) are 0644 or 0444 unless
// told otherwise, and refusing them would lock their users out.
void WarnIfOpenToOthers(const std::string& path, const std::string& source) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || (st.st_mode & 077) == 0) return;
  std::cerr << absl::StrFormat(
                   "ftctl: warning: the token file %s (%s) is open to group or others (mode %04o): whoever reads it "
                   "can act as you; chmod 600 %s",
                   path, source, st.st_mode & 07777, path)
            << std::endl;
}

// The token from `path`: its first line, surrounding blanks removed. The message never holds it.
absl::StatusOr<std::string> ReadToken(const std::string& path, const std::string& source) {
  WarnIfOpenToOthers(path, source);
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return absl::InvalidArgumentError(absl::StrCat("the token file ", path, " (", source, ") cannot be read"));
  }
  const auto b = line.find_first_not_of(" \t\r");
  const auto e = line.find_last_not_of(" \t\r");
  if (b == std::string::npos) return absl::InvalidArgumentError(absl::StrCat("the token file ", path, " (", source, ") is empty"));
  return line.substr(b, e - b + 1);
}

}  // namespace

namespace {

// A unix socket at `path`, which the caller owns unless `anyone`: a socket under a directory others
// may write to could be another user's daemon posing as the caller's.
bool IsSocket(const fs::path& path, bool anyone = false) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && (anyone || st.st_uid == ::getuid());
}

bool IsDir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

// "~/x" for a path under $HOME, for shorter messages.
std::string Tilde(const std::string& path) {
  const char* h = std::getenv("HOME");
  if (h != nullptr && *h != '\0' && absl::StartsWith(path, std::string(h) + "/")) return "~" + path.substr(strlen(h));
  return path;
}

}  // namespace

LocalDaemon FindLocalDaemon() {
  LocalDaemon l;
  const auto found = [&](const std::string& socket, const std::string& source, bool anyone = false) {
    l.looked.push_back(socket);
    if (l.address.empty() && IsSocket(socket, anyone)) {
      l.address = absl::StrCat("unix:", socket);
      l.source = source;
    }
  };
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  if (!ec) {
    for (fs::path d = cwd;; d = d.parent_path()) {
      const bool project = fs::exists(d / kRunScript, ec) && IsDir(d / "runs");
      if (IsSocket(d / kRunScriptSocket) || project) {
        l.project = d.string();
        found((d / kRunScriptSocket).string(), absl::StrCat("scripts/run.sh's ftd in ", d.string(),
                                                            ", found from the current directory"));
        break;
      }
      if (d == d.root_path() || d.parent_path() == d) break;
    }
  }
  if (l.project.empty()) l.looked.push_back(absl::StrCat(kRunScriptSocket, " in the current directory and its parents"));
  found(kSystemSocket, "the default: the local ftd of the systemd unit", /*anyone=*/true);  // in root's /run/ftd
  const std::string data = DefaultDataDir();
  if (fs::path(data).is_absolute()) found(SocketIn(data), absl::StrCat("ftd's default data directory ", Tilde(data)));
  return l;
}

std::string StartHint(const std::string& address, const LocalDaemon& local) {
  const std::string run_again = local.project.empty()
      ? ""
      : absl::StrCat("scripts/run.sh's ftd in ", local.project, " is not running: start it again with ",
                     (fs::path(local.project) / kRunScript).string(), " --daemon-only (its jobs are in ",
                     (fs::path(local.project) / kRunScriptDataDir).string(), ")");
  if (!absl::StartsWith(address, "unix:")) {
    std::string hint = absl::StrCat("Check that ftd runs there, or give its address with --addr or $FTD_ADDR; to start one there: ftd --listen ",
                                    address, " &  (over TCP every call needs a token or a client certificate; on this machine its unix socket needs none: docs/security.md)");
    return run_again.empty() ? hint : absl::StrCat(run_again, ". Or: ", hint);
  }
  const fs::path socket = address.substr(5);
  const fs::path dir = socket.parent_path();
  // scripts/run.sh's: its own directory layout says which data directory its jobs are in.
  if (socket.filename() == fs::path(kRunScriptSocket).filename() && dir.filename() == "runs" &&
      fs::exists(dir.parent_path() / kRunScript)) {
    return absl::StrCat("scripts/run.sh's ftd is not running: start it again with ",
                        (dir.parent_path() / kRunScript).string(), " --daemon-only (its jobs are in ",
                        (dir.parent_path() / kRunScriptDataDir).string(), ")");
  }
  std::error_code ec;
  if (socket.filename() == "ftd.sock" && fs::exists(dir / "ftd.db", ec)) {
    return absl::StrCat("To start it again on its data directory: ftd --data-dir ", dir.string(), " &");
  }
  return absl::StrCat("To start one there: ftd --socket ", socket.string(),
                      " --data-dir DATA_DIR &  (DATA_DIR: the data directory its jobs are in; ftd --help names the default)");
}

absl::StatusOr<ClientOptions> ResolveOptions(const GlobalFlags& flags) {
  std::string addr = absl::StrCat("127.0.0.1:", kDefaultPort), source = "the default";
  std::error_code ec;
  auto cfg = LoadConfig(flags.context);
  if (!cfg.ok()) return cfg.status();
  double timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 30;
  if (!cfg->addr.empty()) {
    addr = cfg->addr;
    source = cfg->context.empty() ? absl::StrCat("from ", cfg->path) : absl::StrCat("context ", cfg->context, " of ", cfg->path);
  }
  if (const char* env = std::getenv("FTD_ADDR"); env != nullptr && *env != '\0') {
    addr = env;
    source = "from $FTD_ADDR";
  }
  if (!flags.addr.empty()) {
    addr = flags.addr;
    source = "from --addr";
  }
  // No address given: a local ftd's socket, if one is found (FindLocalDaemon).
  const bool given = !flags.addr.empty() || !cfg->addr.empty() || (std::getenv("FTD_ADDR") != nullptr && *std::getenv("FTD_ADDR") != '\0');
  const LocalDaemon local = FindLocalDaemon();
  if (!given && !local.address.empty()) {
    addr = local.address;
    source = local.source;
  }
  if (flags.timeout_s > 0) timeout_s = flags.timeout_s;
  auto normalized = NormalizeAddress(addr);
  if (!normalized.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(normalized.status().message(), ", ", source));
  }
  ClientOptions opts;
  opts.address = *normalized;
  opts.address_source = source;
  opts.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  opts.ca_file = flags.ca_file.empty() ? cfg->ca_file : flags.ca_file;
  opts.cert_file = flags.cert_file.empty() ? cfg->cert_file : flags.cert_file;
  opts.key_file = flags.key_file.empty() ? cfg->key_file : flags.key_file;
  opts.tls = cfg->tls || !opts.ca_file.empty() || !opts.cert_file.empty();
  if (opts.cert_file.empty() != opts.key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a client certificate needs both its certificate and its key: give ", opts.cert_file.empty() ? "--cert-file" : "--key-file",
        " too (or cert_file and key_file in the context)"));
  }
  // How to start the daemon if it cannot be reached, and, when a call over TCP is refused for lack
  // of credentials, where this machine's socket is (which needs none).
  if (!given && local.address.empty()) {
    opts.start_hint = absl::StrCat(
        "ftctl looked for a local ftd's socket at ", absl::StrJoin(local.looked, ", ", [](std::string* out, const std::string& p) {
          absl::StrAppend(out, Tilde(p));
        }),
        " and found none. ",
        local.project.empty() ? "" : absl::StrCat(StartHint("unix:" + (fs::path(local.project) / kRunScriptSocket).string(), local), ". "),
        "To start one: ftd &  (its data in ", Tilde(DefaultDataDir()),
        ", where ftctl then finds its socket), or scripts/run.sh --daemon-only in the project directory; or give an "
        "ftd's address with --addr or $FTD_ADDR");
  } else {
    opts.start_hint = StartHint(opts.address, local);
  }
  if (!absl::StartsWith(opts.address, "unix:")) {
    opts.local_hint = local.address.empty()
        ? absl::StrCat("ftctl found no local ftd's socket (it looked at ", absl::StrJoin(local.looked, ", "), ")")
        : absl::StrCat("on this machine ftd's unix socket needs neither: --addr ", local.address, " (", local.source, ")");
  }
  std::string token_file = cfg->token_file, token_source = absl::StrCat("token_file of context ", cfg->context);
  if (const char* e = std::getenv("FTD_TOKEN_FILE"); e != nullptr && *e != '\0') {
    token_file = e;
    token_source = "$FTD_TOKEN_FILE";
  }
  if (!token_file.empty()) {
    auto token = ReadToken(token_file, token_source);
    if (!token.ok()) return token.status();
    opts.token = *token;
  }
  return opts;
}

}  // namespace ftd::client

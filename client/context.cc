#include "client/context.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ftd::client {

namespace fs = std::filesystem;

namespace {
std::atomic<bool> g_interrupted{false};
}  // namespace

int Fail(const absl::Status& st) {
  if (g_interrupted) {
    std::cerr << "ftctl: interrupted" << std::endl;
    return kExitInterrupted;
  }
  std::cerr << "ftctl: " << absl::StatusCodeToString(st.code()) << ": " << st.message() << std::endl;
  return kExitCallFailed;
}

int Usage(const std::string& msg) {
  std::cerr << "ftctl: " << msg << std::endl;
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

// Reads the config file if there is one; a file that exists but does not parse is an error.
absl::Status LoadConfig(std::string* addr, double* timeout_s) {
  const std::string path = ConfigPath();
  if (path.empty() || !fs::exists(path)) return absl::OkStatus();
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("config file ", path,
                                                   " is not a JSON object such as {\"addr\": \"host:7070\"}"));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "addr" && it->is_string()) {
      *addr = it->get<std::string>();
    } else if (it.key() == "timeout_s" && it->is_number() && it->get<double>() > 0) {
      *timeout_s = it->get<double>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": unknown or invalid key \"", it.key(),
                                                     "\" (known: \"addr\" (string), \"timeout_s\" (number > 0))"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ClientOptions> ResolveOptions(const GlobalFlags& flags) {
  std::string addr = absl::StrCat("127.0.0.1:", kDefaultPort), source = "the default";
  double timeout_s = 30;
  std::string config_addr;
  if (auto st = LoadConfig(&config_addr, &timeout_s); !st.ok()) return st;
  if (!config_addr.empty()) {
    addr = config_addr;
    source = absl::StrCat("from ", ConfigPath());
  }
  if (const char* env = std::getenv("FTD_ADDR"); env != nullptr && *env != '\0') {
    addr = env;
    source = "from $FTD_ADDR";
  }
  if (!flags.addr.empty()) {
    addr = flags.addr;
    source = "from --addr";
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
  return opts;
}

namespace {

const sigset_t& InterruptSet() {
  static const sigset_t s = [] {
    sigset_t x;
    sigemptyset(&x);
    sigaddset(&x, SIGINT);
    sigaddset(&x, SIGTERM);
    sigaddset(&x, SIGUSR2);
    return x;
  }();
  return s;
}

}  // namespace

void BlockInterruptSignals() { pthread_sigmask(SIG_BLOCK, &InterruptSet(), nullptr); }

bool Interrupted() { return g_interrupted; }

InterruptHandler::InterruptHandler(JobClient* client) : client_(client) {
  thread_ = std::thread([this] {
    int sig = 0;
    sigwait(&InterruptSet(), &sig);
    if (sig == SIGUSR2) return;  // our own wake-up at exit
    g_interrupted = true;
    client_->Interrupt();
  });
}

InterruptHandler::~InterruptHandler() {
  pthread_kill(thread_.native_handle(), SIGUSR2);
  thread_.join();
}

}  // namespace ftd::client

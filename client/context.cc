#include "client/context.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ftd::client {

namespace fs = std::filesystem;

int Fail(const absl::Status& st) {
  std::cerr << "ftctl: " << absl::StatusCodeToString(st.code()) << ": " << st.message() << std::endl;
  return kExitCallFailed;
}

int Usage(const std::string& msg) {
  std::cerr << "ftctl: " << msg << std::endl;
  return kExitUsage;
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
  std::string addr = "127.0.0.1:7070";
  double timeout_s = 30;
  if (auto st = LoadConfig(&addr, &timeout_s); !st.ok()) return st;
  if (const char* env = std::getenv("FTD_ADDR"); env != nullptr && *env != '\0') addr = env;
  if (!flags.addr.empty()) addr = flags.addr;
  if (flags.timeout_s > 0) timeout_s = flags.timeout_s;
  ClientOptions opts;
  opts.address = addr;
  opts.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  return opts;
}

JobClient& Context::client() {
  if (client_ == nullptr) client_ = std::make_unique<JobClient>(opts_);
  return *client_;
}

}  // namespace ftd::client

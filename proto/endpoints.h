// Where a local ftd is found by default, shared by ftd (its defaults) and ftctl (where it looks
// when no address is given; docs/ftctl.md, "Address, contexts and credentials").
#pragma once

#include <cstdlib>
#include <string>

namespace ftd {

// The systemd unit's socket (its RuntimeDirectory).
inline constexpr const char* kSystemSocket = "/run/ftd/ftd.sock";

// ftd's TCP port: an address without one gets it.
inline constexpr int kDefaultPort = 7070;

// ftd's --data-dir by default: $XDG_STATE_HOME/ftd, else $HOME/.local/state/ftd, else ftd-data
// (relative to ftd's working directory).
inline std::string DefaultDataDir() {
  if (const char* x = std::getenv("XDG_STATE_HOME"); x != nullptr && *x != '\0') return std::string(x) + "/ftd";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') return std::string(h) + "/.local/state/ftd";
  return "ftd-data";
}

// The socket for local users that ftd makes in its data directory when --socket is not given.
inline std::string SocketIn(const std::string& data_dir) { return data_dir + "/ftd.sock"; }

// scripts/run.sh's daemon, relative to the project directory: its socket, data directory, and how
// to start it again without submitting a job.
inline constexpr const char* kRunScriptSocket = "runs/ftd.sock";
inline constexpr const char* kRunScriptDataDir = "runs/ftd-data";
inline constexpr const char* kRunScript = "scripts/run.sh";

}  // namespace ftd

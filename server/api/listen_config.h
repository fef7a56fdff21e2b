// Where ftd listens for clients and how it secures each listener (docs/security.md):
//   - a unix socket for local users (always): identity is the peer's uid;
//   - TCP (--listen, optional): TLS with --tls-cert/--tls-key, client certificates with
//     --tls-client-ca. Without TLS only a loopback address is allowed, unless
//     --insecure-listen-without-tls says otherwise.
// Validated once, at start: a bad combination is an error naming the flag and the fix.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ftd::server {

// Whether a --listen address binds only the loopback interface (127.0.0.0/8, ::1, localhost).
bool IsLoopbackAddress(const std::string& host_port);

struct ListenConfig {
  std::string listen;         // host:port, "" for no TCP; "unix:PATH" is taken as socket = PATH, no TCP
  std::string socket;         // "" until Resolve (then $RUNTIME_DIRECTORY/ftd.sock) or main (DATA_DIR/ftd.sock)
  std::string tls_cert, tls_key, tls_client_ca;
  bool insecure = false;      // --insecure-listen-without-tls

  bool tls() const { return !tls_cert.empty(); }
  // Applies the defaults and checks the combination (INVALID_ARGUMENT naming the flag).
  absl::Status Resolve(const std::string& data_dir);
  // The credentials of the TCP listener; the PEM files are read here (an unreadable one is an error naming it).
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials() const;
  // "TCP 127.0.0.1:7070 (port 7070, TLS, client certificates)" for the start-up line.
  std::string Describe(int port) const;
};

}  // namespace ftd::server

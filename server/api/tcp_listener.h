// ftd's TCP port (--listen): ftd accepts its connections itself, holds each to the connection
// limits (connection_limits.h) and hands the ones it keeps to gRPC through an external connection
// acceptor, which does the TLS handshake (within grpc.server_handshake_timeout_ms) and serves the
// connection as if it had accepted it; calls name it "ipv4:ADDR:PORT" as before. gRPC 1.51 offers
// no hook between its own accept and the handshake, and counts no connections per peer: this is
// where that happens.
#pragma once

#include <grpcpp/server_builder.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "server/auth/connection_limits.h"

namespace ftd::server {

class TcpListener {
 public:
  // Binds every address `host_port` names ("127.0.0.1:7070", "[::]:7070", "localhost:0", with or
  // without an "ipv4:"/"ipv6:"/"dns:///" scheme); port 0 picks one, the same for all. Refuses a port
  // another process listens on (no SO_REUSEPORT).
  static absl::StatusOr<std::unique_ptr<TcpListener>> Listen(const std::string& host_port);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  int port() const { return port_; }
  // Accepts in a thread of its own; each connection the limits admit goes to `acceptor` (made by
  // the server's builder; the server must have started).
  void Serve(grpc::experimental::ExternalConnectionAcceptor* acceptor, ConnectionLimits* limits);
  // Stops accepting and closes the listening sockets.
  void Stop();

 private:
  TcpListener() = default;
  void Loop();

  std::vector<int> fds_;
  int port_ = 0;
  int wake_[2] = {-1, -1};  // a pipe: Stop() wakes the accept loop
  grpc::experimental::ExternalConnectionAcceptor* acceptor_ = nullptr;
  ConnectionLimits* limits_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// "ipv4:10.1.2.3" for a connected socket's peer (the key of the per-peer limit), "" if unknown.
std::string PeerAddress(int fd);

}  // namespace ftd::server

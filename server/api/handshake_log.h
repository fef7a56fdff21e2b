// ftd's log of failed TLS handshakes on --listen: one line per failure, naming the peer, the reason
// in OpenSSL's words and what it usually means, at most kHandshakeLinesPerMinute lines a minute (the
// next line says how many were left out), instead of gRPC's own line without the peer.
//
// gRPC (1.51) says nothing of a failed handshake but an OpenSSL error, logged from inside the TLS
// library with no connection attached. The connection is known a moment later, on the same thread:
// the handshaker shuts the failed connection's socket down (grpc_endpoint_shutdown). So gRPC's log
// line is kept aside per thread (InstallHandshakeLog's log function), and ftd's definition of
// shutdown(2) (which gRPC's calls bind to: the executable comes first in the dynamic linker's order)
// finds it there, asks the socket for its peer, writes the line, and shuts the socket down (the
// system call itself). Every other log line of gRPC goes to gRPC's own log function.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace ftd::server {

inline constexpr int kHandshakeLinesPerMinute = 10;

// What a failed handshake's OpenSSL reason ("wrong version number", "certificate verify failed")
// usually means on ftd's side, with what the client should check; "" for a reason not known here.
std::string HandshakeAdvice(const std::string& openssl_reason);

// The rate limit of the lines: at most `per_window` lines per `window`; Admit says whether to write
// one now and how many were left out since the last one written.
class LineLimiter {
 public:
  LineLimiter(int per_window, std::chrono::steady_clock::duration window) : per_window_(per_window), window_(window) {}
  bool Admit(std::chrono::steady_clock::time_point now, int64_t* left_out);

 private:
  std::mutex mu_;
  int per_window_;
  std::chrono::steady_clock::duration window_;
  std::chrono::steady_clock::time_point window_start_{};
  int written_ = 0;
  int64_t left_out_ = 0;
};

// Routes gRPC's log through ftd's (above); `sink` writes one line (stderr in ftd). Call once, before
// the servers start.
void InstallHandshakeLog(std::function<void(const std::string&)> sink);

}  // namespace ftd::server

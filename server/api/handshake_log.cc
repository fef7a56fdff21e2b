#include "server/api/handshake_log.h"

#include <arpa/inet.h>
#include <grpc/support/log.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ftd::server {

namespace {

std::function<void(const std::string&)>* g_sink = nullptr;
LineLimiter g_limiter(kHandshakeLinesPerMinute, std::chrono::minutes(1));

// gRPC's line about the handshake that failed on this thread, until the socket is shut down.
thread_local std::string t_failed_handshake;

// "1.2.3.4:5678", "[::1]:5678"; "" when the socket has no peer address.
std::string PeerOf(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char host[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    return absl::StrCat(host, ":", ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {  // an IPv4 client of a dual-stack socket
      ::inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], host, sizeof host);
      return absl::StrCat(host, ":", ntohs(a->sin6_port));
    }
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    return absl::StrCat("[", host, "]:", ntohs(a->sin6_port));
  }
  return "";
}

// OpenSSL's reason from gRPC's line: "... error:0A00010B:SSL routines::wrong version number."
std::string ReasonOf(const std::string& line) {
  std::string r = line;
  if (const auto p = r.rfind("::"); p != std::string::npos) r = r.substr(p + 2);
  while (!r.empty() && (r.back() == '.' || r.back() == '\n' || r.back() == ' ')) r.pop_back();
  return r;
}

void Log(gpr_log_func_args* args) {
  // gRPC's TLS handshaker logs the failure (ssl_transport_security.cc) before it shuts the
  // connection down; the line is written then, with the peer (shutdown below).
  if (args->severity == GPR_LOG_SEVERITY_ERROR && args->file != nullptr &&
      absl::EndsWith(args->file, "ssl_transport_security.cc") && absl::StartsWith(args->message, "Handshake failed")) {
    t_failed_handshake = args->message;
    return;
  }
  // Every other line as gRPC writes it: severity, source location, message.
  const char* file = args->file != nullptr ? args->file : "?";
  if (const char* slash = std::strrchr(file, '/')) file = slash + 1;
  std::fprintf(stderr, "%s %s:%d] %s\n", gpr_log_severity_string(args->severity), file, args->line, args->message);
}

}  // namespace

std::string HandshakeAdvice(const std::string& reason) {
  if (reason == "wrong version number" || reason == "http request" || reason == "packet length too long") {
    return "the client spoke in clear to this TLS port (a client without the CA: ftctl --ca-file, or ca_file in its "
           "context)";
  }
  if (reason == "certificate verify failed" || reason == "peer did not return a certificate") {
    return "the client's certificate is not signed by --tls-client-ca, or has expired";
  }
  if (absl::StrContains(reason, "alert unknown ca") || absl::StrContains(reason, "alert bad certificate") ||
      absl::StrContains(reason, "alert certificate unknown")) {
    return "the client does not trust ftd's certificate: its CA is not the one that signed --tls-cert, or the "
           "certificate does not name the host it connected to";
  }
  if (absl::StrContains(reason, "alert certificate expired")) return "the client finds ftd's certificate expired";
  if (absl::StrContains(reason, "no shared cipher") || absl::StrContains(reason, "unsupported protocol") ||
      absl::StrContains(reason, "no application protocol")) {
    return "the client's TLS version, ciphers or protocol do not match ftd's (TLS 1.2 or 1.3, HTTP/2)";
  }
  return "";
}

bool LineLimiter::Admit(std::chrono::steady_clock::time_point now, int64_t* left_out) {
  std::lock_guard<std::mutex> l(mu_);
  if (now - window_start_ >= window_) {
    window_start_ = now;
    written_ = 0;
  }
  if (written_ >= per_window_) {
    ++left_out_;
    return false;
  }
  ++written_;
  *left_out = left_out_;
  left_out_ = 0;
  return true;
}

void InstallHandshakeLog(std::function<void(const std::string&)> sink) {
  g_sink = new std::function<void(const std::string&)>(std::move(sink));
  gpr_set_log_function(&Log);
}

}  // namespace ftd::server

// gRPC shuts a connection's socket down when its handshake failed (above). Every call of
// shutdown(2) in ftd, gRPC's included, comes here: it writes the line of a handshake that failed on
// this thread, then makes the system call, as libc's shutdown does.
extern "C" int shutdown(int fd, int how) noexcept {
  using ftd::server::t_failed_handshake;
  if (!t_failed_handshake.empty() && ftd::server::g_sink != nullptr) {
    const std::string reason = ftd::server::ReasonOf(t_failed_handshake);
    t_failed_handshake.clear();
    int64_t left_out = 0;
    if (ftd::server::g_limiter.Admit(std::chrono::steady_clock::now(), &left_out)) {
      const std::string peer = ftd::server::PeerOf(fd);
      const std::string advice = ftd::server::HandshakeAdvice(reason);
      (*ftd::server::g_sink)(absl::StrCat(
          "ftd: TLS handshake failed with ", peer.empty() ? "a client" : peer, ": ", reason,
          advice.empty() ? "" : absl::StrCat(" (", advice, ")"),
          left_out > 0 ? absl::StrCat("; ", left_out, " more failed since the last such line, not logged") : ""));
    }
  }
  return static_cast<int>(::syscall(SYS_shutdown, fd, how));
}

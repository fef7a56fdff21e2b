#include "client/tls_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ftd::client {

namespace {

struct Target {
  std::string host, port;
};

// "host:port" or "[v6]:port"; nothing for unix sockets and URIs.
bool ParseTarget(const std::string& address, Target* t) {
  if (absl::StrContains(address, ":/") || absl::StartsWith(address, "unix") || absl::StartsWith(address, "ipv") ||
      absl::StartsWith(address, "vsock:")) {
    return false;
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  t->host = address.substr(0, colon);
  t->port = address.substr(colon + 1);
  if (t->host.size() >= 2 && t->host.front() == '[' && t->host.back() == ']') t->host = t->host.substr(1, t->host.size() - 2);
  return !t->host.empty();
}

struct Closer {
  void operator()(int* fd) const {
    if (*fd >= 0) ::close(*fd);
    delete fd;
  }
};

// A connected TCP socket to `t` within `timeout`, or -1 with *refused set when every address refused.
int Connect(const Target& t, std::chrono::milliseconds timeout, bool* refused) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(t.host.c_str(), t.port.c_str(), &hints, &res) != 0) return -1;
  int connected = -1;
  bool all_refused = res != nullptr;
  for (addrinfo* a = res; a != nullptr && connected < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, static_cast<int>(timeout.count())) == 1) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      connected = fd;
      break;
    }
    if (errno != ECONNREFUSED) all_refused = false;
    ::close(fd);
  }
  ::freeaddrinfo(res);
  *refused = connected < 0 && all_refused;
  if (connected >= 0) {
    // Blocking from here, each read and write bounded by the timeout.
    ::fcntl(connected, F_SETFL, ::fcntl(connected, F_GETFL) & ~O_NONBLOCK);
    timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
    ::setsockopt(connected, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(connected, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  return connected;
}

bool IsIp(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

// OpenSSL's reason for the last error, e.g. "tlsv1 alert unknown ca".
std::string Reason(unsigned long err) {
  const char* r = ERR_reason_error_string(err);
  return r != nullptr ? r : absl::StrCat("OpenSSL error ", err);
}

// The server's end refused our certificate (an alert it sent), by OpenSSL's reason.
bool RefusedOurCertificate(int reason) {
  switch (reason) {
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
    case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE: return true;
    default: return false;
  }
}

// The server does not speak TLS: what a TLS client reads from a plain HTTP/2 server.
bool NotTls(int reason) {
  return reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_PACKET_LENGTH_TOO_LONG ||
         reason == SSL_R_UNEXPECTED_EOF_WHILE_READING || reason == SSL_R_RECORD_TOO_SMALL ||
         reason == SSL_R_HTTP_REQUEST || reason == SSL_R_UNKNOWN_PROTOCOL;
}

std::string ClientCertRefused(const ClientOptions& o, const std::string& reason) {
  if (o.cert_file.empty()) {
    return absl::StrCat("the TLS handshake failed: ftd asks for a client certificate and refused the call without "
                        "one (", reason, "): give one with --cert-file and --key-file (or cert_file and key_file in "
                        "the context), or a token");
  }
  return absl::StrCat("the TLS handshake failed: ftd refused the client certificate ", o.cert_file, " (", reason,
                      "): check that it is signed by the CA ftd trusts (its --tls-client-ca), that it has not "
                      "expired, and that ", o.key_file, " is its key");
}

}  // namespace

namespace {
ProbeResult Probe(const ClientOptions& o, std::chrono::milliseconds timeout);
}  // namespace

ProbeResult ProbeTcp(const ClientOptions& o, std::chrono::milliseconds timeout) {
  // A write to a server that has closed the connection raises SIGPIPE: held back on this thread
  // during the probe and discarded after it.
  sigset_t pipe, old;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, &old);
  ProbeResult r = Probe(o, timeout);
  const timespec zero{0, 0};
  while (sigtimedwait(&pipe, nullptr, &zero) == SIGPIPE) {
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return r;
}

namespace {

ProbeResult Probe(const ClientOptions& o, std::chrono::milliseconds timeout) {
  ProbeResult r;
  Target t;
  if (!ParseTarget(o.address, &t)) return r;
  bool refused = false;
  std::unique_ptr<int, Closer> fd(new int(Connect(t, timeout, &refused)));
  if (*fd < 0) {
    if (refused) r.why = "connection refused (nothing listens there)";
    return r;
  }
  r.listening = true;
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  if (ctx == nullptr) return r;
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx.get(), kAlpn, sizeof kAlpn);
  const std::string ca = o.ca_file.empty() ? "the system's CA certificates" : o.ca_file;
  if (o.tls) {
    if (o.ca_file.empty()) {
      SSL_CTX_set_default_verify_paths(ctx.get());
    } else if (SSL_CTX_load_verify_locations(ctx.get(), o.ca_file.c_str(), nullptr) != 1) {
      r.why = absl::StrCat("ca_file ", o.ca_file, " holds no PEM certificate");
      return r;
    }
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
    if (!o.cert_file.empty()) {
      if (SSL_CTX_use_certificate_chain_file(ctx.get(), o.cert_file.c_str()) != 1) {
        r.why = absl::StrCat("cert_file ", o.cert_file, " holds no PEM certificate");
        return r;
      }
      if (SSL_CTX_use_PrivateKey_file(ctx.get(), o.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
          SSL_CTX_check_private_key(ctx.get()) != 1) {
        r.why = absl::StrCat("key_file ", o.key_file, " is not the PEM private key of ", o.cert_file);
        return r;
      }
    }
  } else {
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
  }
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx.get()), SSL_free);
  if (ssl == nullptr) return r;
  if (IsIp(t.host)) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), t.host.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl.get(), t.host.c_str());
    SSL_set1_host(ssl.get(), t.host.c_str());
  }
  SSL_set_fd(ssl.get(), *fd);
  ERR_clear_error();
  if (const int rc = SSL_connect(ssl.get()); rc != 1) {
    const long verify = SSL_get_verify_result(ssl.get());
    const unsigned long err = ERR_peek_last_error();
    const int reason = ERR_GET_REASON(err);
    if (o.tls && verify != X509_V_OK) {
      if (verify == X509_V_ERR_HOSTNAME_MISMATCH || verify == X509_V_ERR_IP_ADDRESS_MISMATCH) {
        r.why = absl::StrCat("the TLS handshake failed: ftd's certificate does not name ", t.host,
                             ": its subjectAltName must cover the name you connect to (a certificate for DNS:localhost "
                             "does not cover 127.0.0.1); connect by a name it has, or give ftd a certificate for ",
                             t.host);
      } else if (verify == X509_V_ERR_CERT_HAS_EXPIRED) {
        r.why = "the TLS handshake failed: ftd's certificate has expired: renew its --tls-cert";
      } else {
        r.why = absl::StrCat("the TLS handshake failed: ftd's certificate does not verify against ", ca, " (",
                             X509_verify_cert_error_string(verify),
                             "): check that it is the CA that signed ftd's certificate (--ca-file, or ca_file in the context)");
      }
    } else if (RefusedOurCertificate(reason) && o.tls) {
      r.why = ClientCertRefused(o, Reason(err));
    } else if (NotTls(reason) || (err == 0 && SSL_get_error(ssl.get(), rc) == SSL_ERROR_SYSCALL)) {
      if (o.tls) {
        r.why = "the TLS handshake failed: something listens there but does not speak TLS (an ftd without --tls-cert?): "
                "leave out --ca-file, --cert-file and the context's ca_file, cert_file and \"tls\" for this address";
      }
    } else if (o.tls) {
      r.why = absl::StrCat("the TLS handshake failed (", Reason(err),
                           "): check that ca_file is the CA that signed ftd's certificate and that ftd listens with TLS");
    }
    return r;
  }
  if (!o.tls) {
    r.why = "ftd there speaks TLS and ftctl connected in clear: give the CA that signed its certificate with --ca-file "
            "CA.pem (or ca_file in the context; \"tls\": true for the system's CAs)";
    return r;
  }
  // TLS 1.3 finishes the client's side of the handshake before the server has looked at the client's
  // certificate: its verdict comes with the first read. Start HTTP/2 (the preface and an empty
  // SETTINGS frame); a server that accepted us answers with its SETTINGS.
  static const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0\0";
  char buf[9];
  ERR_clear_error();
  if (SSL_write(ssl.get(), kPreface, sizeof kPreface - 1) <= 0 || SSL_read(ssl.get(), buf, sizeof buf) <= 0) {
    const unsigned long err = ERR_peek_last_error();
    if (err != 0 && RefusedOurCertificate(ERR_GET_REASON(err))) {
      r.why = ClientCertRefused(o, Reason(err));
    } else if (!o.cert_file.empty()) {
      // gRPC's server closes the connection without an alert when it refuses a client certificate
      // under TLS 1.3; a server that took it would have answered with its SETTINGS.
      r.why = ClientCertRefused(o, "it closed the connection as soon as the handshake ended");
    }
  }
  return r;
}

}  // namespace
}  // namespace ftd::client

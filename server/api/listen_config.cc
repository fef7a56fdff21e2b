#include "server/api/listen_config.h"

#include <arpa/inet.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ftd::server {

bool IsLoopbackAddress(const std::string& host_port) {
  std::string host = host_port;
  for (const char* scheme : {"dns:///", "ipv4:", "ipv6:"}) {
    if (absl::StartsWith(host, scheme)) host = host.substr(std::string(scheme).size());
  }
  if (!host.empty() && host.front() == '[') {
    host = host.substr(1, host.find(']') == std::string::npos ? std::string::npos : host.find(']') - 1);
  } else if (std::count(host.begin(), host.end(), ':') == 1) {
    host = host.substr(0, host.find(':'));
  }
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;  // a name other than localhost, 0.0.0.0, [::], a real address
}

absl::Status ListenConfig::Resolve(const std::string& data_dir) {
  (void)data_dir;
  if (absl::StartsWith(listen, "unix:")) {
    if (!socket.empty() && socket != listen.substr(5)) {
      return absl::InvalidArgumentError("--listen unix:PATH and --socket name two sockets: give one");
    }
    socket = listen.substr(5);
    listen.clear();
  }
  if (socket.empty()) {
    if (const char* rt = std::getenv("RUNTIME_DIRECTORY"); rt != nullptr && *rt != '\0') {
      socket = absl::StrCat(std::string(rt).substr(0, std::string(rt).find(':')), "/ftd.sock");
    }
  }
  if (tls_cert.empty() != tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together: give both, or neither");
  }
  if (!tls_client_ca.empty() && !tls()) {
    return absl::InvalidArgumentError("--tls-client-ca needs TLS: give --tls-cert and --tls-key too");
  }
  if (tls() && listen.empty()) return absl::InvalidArgumentError("--tls-cert is given but --listen is empty");
  if (!listen.empty() && !tls() && !insecure && !IsLoopbackAddress(listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen ", listen, " is not a loopback address and there is no TLS: tokens would cross the network in "
        "clear. Give --tls-cert and --tls-key (docs/security.md), listen on 127.0.0.1, or, on a network you trust "
        "entirely, pass --insecure-listen-without-tls"));
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  if (!in || s.str().empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " cannot be read"));
  if (!absl::StrContains(s.str(), "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " is not a PEM file"));
  }
  return s.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ListenConfig::Credentials() const {
  if (!tls()) return grpc::InsecureServerCredentials();
  auto cert = ReadPem(tls_cert, "--tls-cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(tls_key, "--tls-key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions o;
  o.pem_key_cert_pairs.push_back({*key, *cert});
  if (!tls_client_ca.empty()) {
    auto ca = ReadPem(tls_client_ca, "--tls-client-ca");
    if (!ca.ok()) return ca.status();
    o.pem_root_certs = *ca;
    // Verified when presented; clients without one may still use a token.
    o.client_certificate_request = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(o);
}

std::string ListenConfig::Describe(int port) const {
  return absl::StrCat("TCP ", listen, " (port ", port, ", ",
                      tls() ? (tls_client_ca.empty() ? "TLS" : "TLS, client certificates") : "no TLS", ")");
}

}  // namespace ftd::server

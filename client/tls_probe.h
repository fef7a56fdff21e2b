// Why ftd at a TCP address cannot be reached, found by trying the connection directly. gRPC tells
// a client only "no answer" (a TLS server talked to in clear) or a raw SSL error; this connects with
// OpenSSL and the client's own TLS settings and says which side of the handshake failed and what to
// check: a server that speaks TLS to a client that does not, the reverse, a server certificate that
// does not verify against ca_file or does not name the host, a client certificate the server refused.
#pragma once

#include <chrono>
#include <string>

#include "client/job_client.h"

namespace ftd::client {

struct ProbeResult {
  bool listening = false;  // something accepted the TCP connection: starting a daemon is no advice
  std::string why;         // what failed and what to check; empty: the probe found nothing wrong
};

// Connects to `o.address` ("host:port", "[v6]:port"; other targets are not probed) within `timeout`
// and, if something listens, tries the TLS handshake `o` asks for (or, for a client in clear,
// whether the server speaks TLS).
ProbeResult ProbeTcp(const ClientOptions& o, std::chrono::milliseconds timeout);

}  // namespace ftd::client

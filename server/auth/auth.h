// Authentication: who a call comes from, established once per call in gRPC's interceptor layer
// before any handler runs, and the audit record of every mutating call.
//
// Identity comes from the transport, never from a request field:
//   - a bearer token ("authorization: Bearer ftd_<id>_<secret>") checked against AuthStore;
//   - else a verified TLS client certificate (mTLS): its common name is the user;
//   - else a local client on ftd's unix socket: the uid the kernel reports (SO_PEERCRED).
// A call with none of these, or with a token that does not verify, is UNAUTHENTICATED.
//
// Why an interceptor and not an AuthMetadataProcessor: the unix socket's peer uid is known per
// connection, and gRPC 1.51 exposes neither the peer nor the connection to a metadata processor (nor
// runs one on insecure credentials). ftd therefore accepts unix connections itself (UnixListener),
// reads SO_PEERCRED, and hands each connection to gRPC, whose calls then name it as the peer "fd:N".
// The interceptor resolves every call's identity and keeps it for the handler (CallAuth::Caller).
//
// Defined in one file per class: unix_listener.cc (UnixListener), auth.cc (Authenticator) and
// call_auth.cc (CallAuth, the interceptor and the audit record).
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>
#include <sys/socket.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "ftd/v1/admin.pb.h"
#include "google/protobuf/message.h"
#include "server/auth/auth_store.h"
#include "server/auth/call_limits.h"
#include "server/common/clock.h"
#include "server/auth/connection_limits.h"
#include "server/auth/unauthenticated_audit.h"

namespace ftd::server {

using Identity = ftd::v1::Identity;

// The name of local user `uid` ("alice"), or "uid:1234" when it has none.
std::string LocalUserName(uid_t uid);

// ftd's unix socket for local clients: accepts connections, records each peer's credentials, and
// gives the connection to a gRPC server.
class UnixListener {
 public:
  // Binds `path` (mode 0666: any local user may connect; who they are is the kernel's word). An old
  // socket file nobody listens on is replaced; one a live daemon listens on is an error.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Listen(const std::string& path);
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Starts accepting in a thread of its own; each connection `limits` admits (its peer the local
  // user; root and `daemon_uid` not held to the per-peer limit) goes to `server`, the others are
  // closed at once.
  void Serve(grpc::Server* server, ConnectionLimits* limits, uid_t daemon_uid);
  // Stops accepting and removes the socket file.
  void Stop();
  // The credentials of the connection gRPC names `grpc_peer` ("fd:N"), while it is open.
  std::optional<ucred> PeerOf(const std::string& grpc_peer) const;
  const std::string& path() const { return path_; }

 private:
  UnixListener() = default;
  void Loop(grpc::Server* server, ConnectionLimits* limits, uid_t daemon_uid);
  int Adopt(int fd);

  struct Conn {
    ucred cred{};
    ino_t inode = 0;  // the socket's inode: a reused descriptor number holds another one
  };
  std::string path_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  std::map<int, Conn> conns_;
  int next_fd_ = 0;
};

struct AuthConfig {
  std::set<std::string> admins;  // local user names and certificate CNs with the admin role
  uid_t daemon_uid = 0;          // root and the daemon's own user are admins on the unix socket
  bool client_certs = false;     // TLS client certificates are verified (--tls-client-ca): CN = user
};

// What a call presents, and who that makes it. No gRPC types: unit-tested on its own.
class Authenticator {
 public:
  Authenticator(AuthConfig cfg, AuthStore* tokens, const Clock* clock, const UnixListener* local)
      : cfg_(std::move(cfg)), tokens_(tokens), clock_(clock), local_(local) {}

  struct Presented {
    std::string peer;                         // gRPC's peer: "ipv4:10.1.2.3:5123", "fd:12"
    std::optional<std::string> authorization;  // the authorization header's value, when sent
    std::string cert_cn;                      // a verified client certificate's common name
  };
  absl::StatusOr<Identity> Authenticate(const Presented& p) const;

  // The identity of a local uid (root and the daemon's user are admins, and names in `admins`).
  Identity Local(const ucred& c) const;

 private:
  AuthConfig cfg_;
  AuthStore* tokens_;
  const Clock* clock_;
  const UnixListener* local_;
};

// The interceptor factory ftd's public server is built with, and the per-call identities it
// established. Every mutating call (any ftd.v1 method but Get*, List*, Watch* and WhoAmI) is
// appended to the audit log with its outcome before the answer is sent: an authenticated one in two
// steps (BeginAudit before it changes anything, its outcome at the end), so that a call whose
// record cannot be written is refused, not done unrecorded; one refused for want of credentials
// through UnauthenticatedAudit, aggregated per peer.
class CallAuth {
 public:
  // `limits`: applied to every call (null: none).
  CallAuth(const Authenticator* auth, AuthStore* audit, const Clock* clock, CallLimiter* limits = nullptr)
      : auth_(auth), audit_(audit), clock_(clock), limits_(limits), refused_(audit, clock) {}

  // Writes the aggregated records of refused unauthenticated calls as each minute ends (ftd; tests
  // that need no such records leave it off).
  void StartAuditFlusher() { refused_.Start(); }

  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> InterceptorFactory();
  // The caller of the call `ctx` serves: UNAUTHENTICATED saying why when it proved no identity.
  absl::StatusOr<Identity> Caller(const grpc::ServerContextBase* ctx) const;

  static bool IsMutating(const std::string& method);

  // Counts the call `ctx` of `who` against the rate and stream limits (server/auth/call_limits.h; an
  // admin's against the admin stream limit only), keyed by user and connection: RESOURCE_EXHAUSTED
  // naming the limit, or a lease to hold while it runs.
  absl::StatusOr<CallLimiter::Lease> Admit(const grpc::ServerContextBase* ctx, const Identity& who, bool stream) const;

  // Before an audited call changes anything: its record, with the outcome still unknown. An error
  // (RESOURCE_EXHAUSTED for a full disk, UNAVAILABLE otherwise) says the call must not go ahead.
  // OK at once for a call that is not audited.
  absl::Status BeginAudit(const grpc::ServerContextBase* ctx) const;

  // What an audited call's record names: the target (the response's job or token id, else the
  // request's id) and the request's plain fields. Handlers call it (through Authed, handler.h) with
  // their typed messages; `resp` may be null.
  void Describe(const grpc::ServerContextBase* ctx, const google::protobuf::Message* req,
                const google::protobuf::Message* resp) const;

 private:
  friend class AuthInterceptor;
  // `by`: the interceptor of the call, so that a late Forget never drops a newer call on a reused context.
  void Register(const grpc::ServerContextBase* ctx, const void* by, absl::StatusOr<Identity> who, bool audited,
                std::string action);
  struct Described {
    std::string target, detail;
    int64_t audit_seq = 0;  // the record BeginAudit wrote; 0: none
  };
  Described DescribedCall(const grpc::ServerContextBase* ctx, const void* by) const;
  void Forget(const grpc::ServerContextBase* ctx, const void* by);

  const Authenticator* auth_;
  AuthStore* audit_;
  const Clock* clock_;
  CallLimiter* limits_;
  UnauthenticatedAudit refused_;
  mutable std::mutex mu_;
  struct Call {
    const void* by;
    absl::StatusOr<Identity> who;
    bool audited;
    std::string action;
    std::string target, detail;
    int64_t audit_seq = 0;
  };
  mutable std::map<const grpc::ServerContextBase*, Call> calls_;
};

}  // namespace ftd::server

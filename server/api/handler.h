// What every public gRPC handler shares: no exception escapes (anything thrown becomes INTERNAL with
// its text), and the work runs only for an authenticated caller (UNAUTHENTICATED otherwise), whose
// request is parsed only then (Authenticated, for ParsedService).
#pragma once

#include <grpcpp/grpcpp.h>

#include <exception>
#include <string>

#include "proto/grpc_status.h"
#include "server/auth/auth.h"
#include "server/api/parsed_service.h"

namespace ftd::server {

template <typename F>
grpc::Status Guard(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return ToGrpc(absl::InternalError(std::string("internal error: ") + e.what()));
  } catch (...) {
    return ToGrpc(absl::InternalError("internal error"));
  }
}

// Runs f(caller) for the identity the auth interceptor established for `ctx`, within the caller's
// rate and stream limits and once an audited call's record is written (CallAuth::BeginAudit), and
// gives the audit log the call's request and response (`resp` is null for a streaming call: it then
// holds one of the caller's stream places while f runs).
template <typename F>
grpc::Status Authed(const CallAuth* auth, const grpc::ServerContextBase* ctx, const google::protobuf::Message* req,
                    const google::protobuf::Message* resp, F&& f) {
  return Guard([&] {
    auto who = auth->Caller(ctx);
    absl::StatusOr<CallLimiter::Lease> lease = who.ok() ? auth->Admit(ctx, *who, resp == nullptr) : who.status();
    absl::Status recorded = lease.ok() ? auth->BeginAudit(ctx) : absl::OkStatus();
    grpc::Status st = !lease.ok() ? ToGrpc(lease.status()) : !recorded.ok() ? ToGrpc(recorded) : f(*who);
    auth->Describe(ctx, req, st.ok() ? resp : nullptr);
    return st;
  });
}

// What a ParsedService asks before it parses a request: that the call proved an identity. A call
// without one is UNAUTHENTICATED with its bytes unread. Null `auth` (tests of the services' shape): none.
inline ParsedService::Gate Authenticated(const CallAuth* auth) {
  if (auth == nullptr) return nullptr;
  return [auth](const grpc::ServerContextBase* ctx) { return auth->Caller(ctx).status(); };
}

}  // namespace ftd::server

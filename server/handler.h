// What every public gRPC handler shares: no exception escapes (anything thrown becomes INTERNAL with
// its text), and the work runs only for an authenticated caller (UNAUTHENTICATED otherwise).
#pragma once

#include <grpcpp/grpcpp.h>

#include <exception>
#include <string>

#include "proto/grpc_status.h"
#include "server/auth.h"

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

// Runs f(caller) for the identity the auth interceptor established for `ctx`, and gives the audit
// log the call's request and response (`resp` may be null: a stream).
template <typename F>
grpc::Status Authed(const CallAuth* auth, const grpc::ServerContextBase* ctx, const google::protobuf::Message* req,
                    const google::protobuf::Message* resp, F&& f) {
  return Guard([&] {
    auto who = auth->Caller(ctx);
    grpc::Status st = who.ok() ? f(*who) : ToGrpc(who.status());
    auth->Describe(ctx, req, st.ok() ? resp : nullptr);
    return st;
  });
}

}  // namespace ftd::server

// A gRPC service whose every method parses its request only once the call is admitted (its caller
// authenticated: the Gate), and answers a request that does not parse with INVALID_ARGUMENT naming
// the field, instead of gRPC's bare INTERNAL.
//
// gRPC's synchronous server parses a request before any interceptor or handler sees it, and a failed
// parse (a proto3 string holding invalid UTF-8, a truncated or corrupt message) goes back as
// INTERNAL with an empty message, after libprotobuf wrote a line to the daemon's log. So the parse
// moves into the method handler itself: its Deserialize keeps the request's bytes, unread; its
// RunHandler (which runs after the interceptors, so after authentication) first asks the Gate, and
// a call the Gate refuses is answered with the Gate's status, its bytes never parsed. An admitted
// call's bytes are parsed by gRPC's own typed handler, and on a failure read again to name the
// offending field. A ParsedService registers its methods itself (the generated Service base cannot
// swap a method's handler in place). The methods are checked against the service's descriptor, and
// Unregistered() lists any left out, so a method added to the .proto without a line here is caught
// by the tests and at start.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/method_handler.h>

#include <deque>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"

namespace ftd::server {

// INVALID_ARGUMENT for request bytes `wire` of type `type` that did not parse: naming the first
// string field that is not valid UTF-8 ("spec.data.path is not valid UTF-8 ..."), else saying the
// message is malformed.
absl::Status RequestParseError(const google::protobuf::Descriptor* type, std::string_view wire);

class ParsedService : public grpc::Service {
 public:
  // Whether the call `ctx` serves may have its request parsed and its handler run; a non-OK status
  // is the call's answer.
  using Gate = std::function<absl::Status(const grpc::ServerContextBase* ctx)>;

  // Methods of the service with no handler registered; empty once the service is complete.
  std::vector<std::string> Unregistered() const;

 protected:
  // `service`: the full name of the service in the .proto ("ftd.v1.JobService"); `gate`: asked
  // before each request is parsed (null: every call is admitted).
  ParsedService(std::string_view service, Gate gate);

  // Registers a unary method `name` served by `fn` of the derived class `Impl`.
  template <class Impl, class Req, class Resp>
  void Register(const char* name, grpc::Status (Impl::*fn)(grpc::ServerContext*, const Req*, Resp*)) {
    const auto* m = Method(name, Req::descriptor(), false);
    Add(m, grpc::internal::RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<Impl, Req, Resp>(
            [fn](Impl* s, grpc::ServerContext* c, const Req* q, Resp* r) { return (s->*fn)(c, q, r); },
            static_cast<Impl*>(this)));
  }
  // Registers a server-streaming method `name` served by `fn`.
  template <class Impl, class Req, class Resp>
  void Register(const char* name,
                grpc::Status (Impl::*fn)(grpc::ServerContext*, const Req*, grpc::ServerWriter<Resp>*)) {
    const auto* m = Method(name, Req::descriptor(), true);
    Add(m, grpc::internal::RpcMethod::SERVER_STREAMING,
        new grpc::internal::ServerStreamingHandler<Impl, Req, Resp>(
            [fn](Impl* s, grpc::ServerContext* c, const Req* q, grpc::ServerWriter<Resp>* w) {
              return (s->*fn)(c, q, w);
            },
            static_cast<Impl*>(this)));
  }

 private:
  // The method `name`, checked to take `request` and to stream its answer iff `server_streaming`
  // (std::logic_error otherwise: a programming error).
  const google::protobuf::MethodDescriptor* Method(const char* name, const google::protobuf::Descriptor* request,
                                                   bool server_streaming);
  void Add(const google::protobuf::MethodDescriptor* m, grpc::internal::RpcMethod::RpcType type,
           grpc::internal::MethodHandler* typed);

  const google::protobuf::ServiceDescriptor* service_;
  Gate gate_;
  std::deque<std::string> paths_;  // "/ftd.v1.JobService/GetJob": gRPC keeps pointers to them
  std::set<std::string> registered_;
};

}  // namespace ftd::server

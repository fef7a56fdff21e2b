#include "server/api/parsed_service.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>

#include <memory>
#include <new>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "proto/grpc_status.h"
#include "server/requests/request_limits.h"

namespace ftd::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::MethodDescriptor;

// The bytes of `bb` (decompressed where the call was compressed).
std::string ReadAll(grpc_byte_buffer* bb) {
  grpc_byte_buffer_reader reader;
  if (grpc_byte_buffer_reader_init(&reader, bb) == 0) return "";
  grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
  std::string out(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(all)), GRPC_SLICE_LENGTH(all));
  grpc_slice_unref(all);
  grpc_byte_buffer_reader_destroy(&reader);
  return out;
}

// What Deserialize hands on to RunHandler: the request's bytes, not yet parsed (in the call's arena).
struct Unparsed {
  grpc_byte_buffer* bytes;  // owned; null when the call carried no message
};

// gRPC's typed handler, run only for a call the gate admits, with its parse moved from Deserialize
// (before the interceptors authenticate the call) to RunHandler (after), and its parse failure
// answered by RequestParseError.
class GatedHandler final : public grpc::internal::MethodHandler {
 public:
  GatedHandler(grpc::internal::MethodHandler* typed, const Descriptor* request, const ParsedService::Gate* gate)
      : typed_(typed), request_(request), gate_(gate) {}

  void* Deserialize(grpc_call* call, grpc_byte_buffer* req, grpc::Status* status, void** /*handler_data*/) override {
    *status = grpc::Status::OK;
    return new (grpc_call_arena_alloc(call, sizeof(Unparsed))) Unparsed{req};
  }

  void RunHandler(const HandlerParameter& p) override {
    grpc_byte_buffer* bytes = p.request != nullptr ? static_cast<Unparsed*>(p.request)->bytes : nullptr;
    grpc::Status status = p.status;
    void* parsed = nullptr;
    if (status.ok() && *gate_) status = ToGrpc((*gate_)(p.server_context));
    if (status.ok()) {
      // The typed parse consumes the bytes; a copy (slices are reference-counted) is kept for the error.
      grpc_byte_buffer* copy = bytes != nullptr ? grpc_byte_buffer_copy(bytes) : nullptr;
      parsed = typed_->Deserialize(p.call->call(), bytes, &status, nullptr);
      bytes = nullptr;
      if (!status.ok()) {
        status = ToGrpc(copy == nullptr ? absl::InvalidArgumentError(absl::StrCat("the call carried no ",
                                                                                  request_->full_name(), " message"))
                                        : RequestParseError(request_, ReadAll(copy)));
      }
      if (copy != nullptr) grpc_byte_buffer_destroy(copy);
    }
    if (bytes != nullptr) grpc_byte_buffer_destroy(bytes);  // refused: never read
    // A status that is not OK is answered by the typed handler without running the method.
    typed_->RunHandler(HandlerParameter(p.call, p.server_context, parsed, status, p.internal_data, p.call_requester));
  }

 private:
  std::unique_ptr<grpc::internal::MethodHandler> typed_;
  const Descriptor* request_;
  const ParsedService::Gate* gate_;
};

}  // namespace

absl::Status RequestParseError(const Descriptor* type, std::string_view wire) {
  const std::string field = FindInvalidUtf8(type, wire);
  if (!field.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is not valid UTF-8; send text encoded as UTF-8"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", type->full_name(), " (malformed protobuf, ", wire.size(), " bytes)"));
}

ParsedService::ParsedService(std::string_view service, Gate gate)
    : service_(google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(std::string(service))),
      gate_(std::move(gate)) {
  if (service_ == nullptr) throw std::logic_error(absl::StrCat("no service ", std::string(service), " is linked in"));
}

const MethodDescriptor* ParsedService::Method(const char* name, const Descriptor* request, bool server_streaming) {
  const MethodDescriptor* m = service_->FindMethodByName(name);
  if (m == nullptr || m->input_type() != request || m->client_streaming() ||
      m->server_streaming() != server_streaming) {
    throw std::logic_error(absl::StrCat(service_->full_name(), ".", name, " is not a ",
                                        server_streaming ? "server-streaming" : "unary", " method taking ",
                                        request->full_name()));
  }
  return m;
}

void ParsedService::Add(const MethodDescriptor* m, grpc::internal::RpcMethod::RpcType type,
                        grpc::internal::MethodHandler* typed) {
  if (!registered_.insert(m->name()).second) {
    delete typed;
    throw std::logic_error(absl::StrCat(m->full_name(), " is registered twice"));
  }
  paths_.push_back(absl::StrCat("/", service_->full_name(), "/", m->name()));
  AddMethod(new grpc::internal::RpcServiceMethod(paths_.back().c_str(), type,
                                                 new GatedHandler(typed, m->input_type(), &gate_)));
}

std::vector<std::string> ParsedService::Unregistered() const {
  std::vector<std::string> out;
  for (int i = 0; i < service_->method_count(); ++i) {
    if (registered_.count(service_->method(i)->name()) == 0) out.push_back(service_->method(i)->full_name());
  }
  return out;
}

}  // namespace ftd::server

#include "proto/grpc_status.h"

#include <string>
#include <utility>

namespace ftd {
namespace {

// clang-format off
constexpr std::pair<absl::StatusCode, grpc::StatusCode> kCodes[] = {
    {absl::StatusCode::kOk,                 grpc::StatusCode::OK},
    {absl::StatusCode::kCancelled,          grpc::StatusCode::CANCELLED},
    {absl::StatusCode::kUnknown,            grpc::StatusCode::UNKNOWN},
    {absl::StatusCode::kInvalidArgument,    grpc::StatusCode::INVALID_ARGUMENT},
    {absl::StatusCode::kDeadlineExceeded,   grpc::StatusCode::DEADLINE_EXCEEDED},
    {absl::StatusCode::kNotFound,           grpc::StatusCode::NOT_FOUND},
    {absl::StatusCode::kAlreadyExists,      grpc::StatusCode::ALREADY_EXISTS},
    {absl::StatusCode::kPermissionDenied,   grpc::StatusCode::PERMISSION_DENIED},
    {absl::StatusCode::kResourceExhausted,  grpc::StatusCode::RESOURCE_EXHAUSTED},
    {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
    {absl::StatusCode::kAborted,            grpc::StatusCode::ABORTED},
    {absl::StatusCode::kOutOfRange,         grpc::StatusCode::OUT_OF_RANGE},
    {absl::StatusCode::kUnimplemented,      grpc::StatusCode::UNIMPLEMENTED},
    {absl::StatusCode::kInternal,           grpc::StatusCode::INTERNAL},
    {absl::StatusCode::kUnavailable,        grpc::StatusCode::UNAVAILABLE},
    {absl::StatusCode::kDataLoss,           grpc::StatusCode::DATA_LOSS},
    {absl::StatusCode::kUnauthenticated,    grpc::StatusCode::UNAUTHENTICATED},
};
// clang-format on

}  // namespace

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  for (const auto& [a, g] : kCodes) {
    if (a == s.code()) return grpc::Status(g, std::string(s.message()));
  }
  return grpc::Status(grpc::StatusCode::UNKNOWN, std::string(s.message()));
}

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  for (const auto& [a, g] : kCodes) {
    if (g == s.error_code()) return absl::Status(a, s.error_message());
  }
  return absl::Status(absl::StatusCode::kUnknown, s.error_message());
}

}  // namespace ftd

#include "proto/grpc_status.h"

#include <gtest/gtest.h>

#include <set>

namespace ftd {
namespace {

// Every code absl defines (kOk..kUnauthenticated are 0..16).
std::vector<absl::StatusCode> AllCodes() {
  std::vector<absl::StatusCode> out;
  for (int c = 0; c <= 16; ++c) out.push_back(static_cast<absl::StatusCode>(c));
  return out;
}

TEST(GrpcStatus, EveryCodeSurvivesTheRoundTripWithItsMessage) {
  for (absl::StatusCode c : AllCodes()) {
    if (c == absl::StatusCode::kOk) continue;
    const absl::Status s(c, "spec.batch_size must be >= 1 (got 0)");
    const grpc::Status g = ToGrpc(s);
    EXPECT_EQ(g.error_message(), "spec.batch_size must be >= 1 (got 0)") << absl::StatusCodeToString(c);
    EXPECT_EQ(FromGrpc(g), s) << absl::StatusCodeToString(c);
  }
}

TEST(GrpcStatus, TheMapIsOneToOne) {
  std::set<int> seen;
  for (absl::StatusCode c : AllCodes()) {
    const grpc::Status g = ToGrpc(absl::Status(c, "x"));
    EXPECT_TRUE(seen.insert(static_cast<int>(g.error_code())).second) << absl::StatusCodeToString(c);
    if (c != absl::StatusCode::kUnknown) {
      EXPECT_NE(g.error_code(), grpc::StatusCode::UNKNOWN) << absl::StatusCodeToString(c) << " has no gRPC code";
    }
  }
  EXPECT_EQ(seen.size(), 17u);
}

TEST(GrpcStatus, TheCodesFtdAnswersWithKeepTheirMeaning) {
  EXPECT_EQ(ToGrpc(absl::InvalidArgumentError("f")).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpc(absl::NotFoundError("f")).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(ToGrpc(absl::FailedPreconditionError("f")).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ToGrpc(absl::ResourceExhaustedError("f")).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ToGrpc(absl::UnavailableError("f")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ToGrpc(absl::PermissionDeniedError("f")).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(ToGrpc(absl::DataLossError("f")).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(ToGrpc(absl::InternalError("f")).error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(ToGrpc(absl::CancelledError("f")).error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(FromGrpc(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "t")), absl::DeadlineExceededError("t"));
}

TEST(GrpcStatus, OkIsOkAndAnUnknownCodeIsUnknown) {
  EXPECT_TRUE(ToGrpc(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpc(grpc::Status::OK).ok());
  const absl::Status s = FromGrpc(grpc::Status(static_cast<grpc::StatusCode>(99), "from the future"));
  EXPECT_EQ(s, absl::UnknownError("from the future"));
}

}  // namespace
}  // namespace ftd

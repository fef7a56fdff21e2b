#include "server/api/parsed_service.h"

#include <gtest/gtest.h>

#include "ftd/v1/jobs.pb.h"
#include "server/api/admin_service.h"
#include "server/api/service.h"

namespace ftd::server {
namespace {

// Every method of the public services has a handler that names the field of a request that does not
// parse: a method added to the .proto without registering it would answer UNIMPLEMENTED.
TEST(ParsedService, EveryMethodOfThePublicServicesIsRegistered) {
  JobServiceImpl jobs(nullptr, nullptr, nullptr, 0);
  AdminServiceImpl admin(nullptr, nullptr, nullptr);
  EXPECT_EQ(jobs.Unregistered(), std::vector<std::string>{});
  EXPECT_EQ(admin.Unregistered(), std::vector<std::string>{});
}

TEST(ParsedService, ParseErrorNamesTheFieldOrSaysMalformed) {
  ftd::v1::GetJobRequest req;
  req.set_id("ABCD");
  std::string wire = req.SerializeAsString();
  wire.replace(wire.find("AB"), 2, "\xff\xfe");
  absl::Status st = RequestParseError(ftd::v1::GetJobRequest::descriptor(), wire);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "id is not valid UTF-8; send text encoded as UTF-8");
  st = RequestParseError(ftd::v1::GetJobRequest::descriptor(), "\x0a\x7f");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "the request is not a valid ftd.v1.GetJobRequest (malformed protobuf, 2 bytes)");
}

}  // namespace
}  // namespace ftd::server

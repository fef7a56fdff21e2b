#include "server/requests/request_match.h"

#include <gtest/gtest.h>

namespace ftd::server {
namespace {

ftd::v1::Job Requested() {
  ftd::v1::Job j;
  j.set_request_id("r-1");
  j.set_name("sweep");
  j.set_kind(ftd::v1::FINETUNE);
  j.set_owner("alice");
  j.set_max_attempts(3);
  j.mutable_spec()->set_steps(10);
  j.mutable_spec()->mutable_optimizer()->set_lr(1e-3);
  return j;
}

TEST(RequestMatch, TheSameRequestMatchesWhateverHappenedToTheJobSince) {
  ftd::v1::Job existing = Requested();
  existing.set_id("j-000007");
  existing.set_state(ftd::v1::RUNNING);
  existing.set_attempt(2);
  existing.set_created_unix_ms(123);
  EXPECT_TRUE(DifferingRequestFields(existing, Requested()).empty());
  EXPECT_TRUE(CheckSameRequest(existing, Requested()).ok());
}

TEST(RequestMatch, NamesEveryDifferingFieldWithItsPath) {
  ftd::v1::Job existing = Requested();
  existing.set_id("j-000007");
  ftd::v1::Job other = Requested();
  other.set_name("sweep-2");
  other.set_priority(5);
  other.mutable_spec()->mutable_optimizer()->set_lr(1e-4);
  other.mutable_spec()->mutable_model()->set_preset("tiny");
  EXPECT_EQ(DifferingRequestFields(existing, other),
            (std::vector<std::string>{"name", "priority", "spec.model", "spec.optimizer.lr"}));
  const absl::Status st = CheckSameRequest(existing, other);
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(st.message().find("j-000007"), std::string::npos) << st;
  EXPECT_NE(st.message().find("\"r-1\""), std::string::npos) << st;
  EXPECT_NE(st.message().find("name, priority, spec.model, spec.optimizer.lr"), std::string::npos) << st;
}

TEST(RequestMatch, MaxAttemptsAndKindCount) {
  ftd::v1::Job existing = Requested();
  ftd::v1::Job other = Requested();
  other.set_max_attempts(5);
  other.set_kind(ftd::v1::PROFILE);
  EXPECT_EQ(DifferingRequestFields(existing, other), (std::vector<std::string>{"kind", "max_attempts"}));
}

}  // namespace
}  // namespace ftd::server

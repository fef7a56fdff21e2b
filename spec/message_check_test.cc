// CheckMessage: what a protobuf parser lets through from outside, refused naming the field.
#include "spec/message_check.h"

#include <gtest/gtest.h>

#include <limits>

#include "ftd/v1/jobs.pb.h"
#include "google/protobuf/unknown_field_set.h"

namespace ftd::spec {
namespace {

ftd::v1::SubmitJobRequest Valid() {
  ftd::v1::SubmitJobRequest r;
  r.set_kind(ftd::v1::PROFILE);
  r.set_name("ok");
  r.mutable_spec()->set_steps(3);
  r.mutable_spec()->mutable_optimizer()->set_lr(1e-3);
  (*r.mutable_spec()->mutable_kernels())["rmsnorm"] = "fused";
  r.mutable_spec()->mutable_lora()->mutable_target_modules()->Add(std::string("q"));
  return r;
}

TEST(CheckMessage, AValidRequestPasses) { EXPECT_TRUE(CheckMessage(Valid(), "").ok()); }

TEST(CheckMessage, UnknownEnumValuesAreRefusedListingTheValidOnes) {
  auto r = Valid();
  r.set_kind(static_cast<ftd::v1::JobKind>(99));
  const auto st = CheckMessage(r, "");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "kind is 99, not a JobKind value: use one of FINETUNE, PROFILE");
}

TEST(CheckMessage, UnknownFieldsAreRefusedWhereverTheySit) {
  auto top = Valid();
  top.GetReflection()->MutableUnknownFields(&top)->AddVarint(99, 1);
  EXPECT_NE(CheckMessage(top, "").message().find("SubmitJobRequest holds field number 99 (varint)"), std::string::npos)
      << CheckMessage(top, "");
  // Bytes from the wire: a nested message with a field this build lacks.
  auto nested = Valid();
  std::string extra;
  ASSERT_TRUE(nested.spec().optimizer().SerializeToString(&extra));
  for (char c : {'\xa0', '\x06', '\x07'}) extra.push_back(c);  // field 100, varint 7
  ASSERT_TRUE(nested.mutable_spec()->mutable_optimizer()->ParseFromString(extra));
  const auto st = CheckMessage(nested, "");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("spec.optimizer holds field number 100 (varint), which this build of ftd does not know"),
            std::string::npos)
      << st;
}

TEST(CheckMessage, NonFiniteNumbersAreRefusedNamingTheirPath) {
  for (double bad : {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    auto a = Valid();
    a.mutable_spec()->mutable_optimizer()->set_eps(bad);
    auto starts = [](const absl::Status& st, const std::string& prefix) {
      return std::string(st.message()).starts_with(prefix) && st.code() == absl::StatusCode::kInvalidArgument;
    };
    EXPECT_TRUE(starts(CheckMessage(a, ""), "spec.optimizer.eps must be a finite number (got ")) << CheckMessage(a, "");
    auto b = Valid();
    b.mutable_spec()->set_peak_flops(bad);
    EXPECT_TRUE(starts(CheckMessage(b.spec(), "spec"), "spec.peak_flops must be a finite number"));
    auto c = Valid();
    c.mutable_spec()->mutable_lora()->set_alpha(bad);
    EXPECT_TRUE(starts(CheckMessage(c, ""), "spec.lora.alpha must be a finite number"));
  }
}

}  // namespace
}  // namespace ftd::spec

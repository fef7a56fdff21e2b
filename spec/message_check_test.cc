// CheckMessage: what a protobuf parser lets through from outside, refused naming the field.
#include "spec/message_check.h"

#include <gtest/gtest.h>

#include <limits>

#include "absl/strings/match.h"
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

TEST(CheckMessage, ControlCharactersInTextFieldsAreRefusedNamingTheField) {
  auto name = Valid();
  name.set_name("run\nftd: job j-000001 RUNNING -> SUCCEEDED (SUCCEEDED): forged line");
  EXPECT_EQ(CheckMessage(name, "").message(),
            "name holds a control character (U+000A, a newline, at byte 3): text fields take printable text only; "
            "remove it");
  auto rid = Valid();
  rid.set_request_id("nightly\x1b]0;owned\a");
  EXPECT_TRUE(absl::StartsWith(CheckMessage(rid, "").message(), "request_id holds a control character (U+001B"));
  // A NUL in every path field: the part after it was silently dropped when the path was opened.
  auto path = Valid();
  path.mutable_spec()->mutable_data()->set_path(std::string("data.bin\0/../../etc/shadow", 26));
  EXPECT_EQ(CheckMessage(path, "").message(),
            "spec.data.path holds a NUL byte (U+0000, a NUL, at byte 8): a path cannot hold one; remove it");
  auto ckpt = Valid();
  ckpt.mutable_spec()->mutable_checkpoint()->set_dir(std::string("ck\0x", 4));
  EXPECT_TRUE(
      absl::StartsWith(CheckMessage(ckpt.spec(), "spec").message(), "spec.checkpoint.dir holds a NUL byte"));
  auto module = Valid();
  module.mutable_spec()->mutable_lora()->add_target_modules("v\x7f");
  EXPECT_TRUE(absl::StartsWith(CheckMessage(module, "").message(),
                               "spec.lora.target_modules[1] holds a control character"));
  auto key = Valid();
  (*key.mutable_spec()->mutable_kernels())["rms\tnorm"] = "fused";
  EXPECT_TRUE(absl::StartsWith(CheckMessage(key, "").message(),
                               "spec.kernels key holds a control character (U+0009, a tab"));
  auto fine = Valid();
  fine.set_name("lr-sweep ünïcode ✓");
  EXPECT_TRUE(CheckMessage(fine, "").ok());
}

}  // namespace
}  // namespace ftd::spec

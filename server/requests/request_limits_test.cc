#include "server/requests/request_limits.h"

#include <gtest/gtest.h>

#include <string>

#include "ftd/v1/jobs.pb.h"

namespace ftd::server {
namespace {

ftd::v1::SubmitJobRequest Request() {
  ftd::v1::SubmitJobRequest req;
  req.set_name("run");
  req.set_owner("alice");
  req.mutable_spec()->mutable_model()->set_preset("tiny");
  req.mutable_spec()->mutable_data()->set_path("/data/tokens.bin");
  return req;
}

void ExpectRefused(const ftd::v1::SubmitJobRequest& req, const std::string& field) {
  const absl::Status st = CheckRequestStrings(req);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_EQ(st.message().substr(0, field.size() + 1), field + " ") << st;
  EXPECT_LT(st.message().size(), 400u) << "the message quotes the whole value";
}

TEST(RequestLimits, ARequestWithinTheBoundsPasses) {
  auto req = Request();
  req.mutable_spec()->mutable_data()->set_path("/" + std::string(kMaxPathBytes - 1, 'p'));
  req.set_name(std::string(kMaxNameBytes, 'n'));
  (*req.mutable_spec()->mutable_kernels())["rmsnorm"] = "fused";
  req.mutable_spec()->mutable_lora()->add_target_modules("q");
  EXPECT_TRUE(CheckRequestStrings(req).ok()) << CheckRequestStrings(req);
}

TEST(RequestLimits, EachLongStringIsRefusedByItsPath) {
  auto req = Request();
  req.mutable_spec()->mutable_data()->set_path("/" + std::string(3'900'000, 'x'));
  ExpectRefused(req, "spec.data.path");
  req = Request();
  req.mutable_spec()->mutable_checkpoint()->set_dir(std::string(kMaxPathBytes + 1, 'd'));
  ExpectRefused(req, "spec.checkpoint.dir");
  req = Request();
  req.set_name(std::string(kMaxNameBytes + 1, 'n'));
  ExpectRefused(req, "name");
  req = Request();
  req.set_owner(std::string(1000, 'o'));
  ExpectRefused(req, "owner");
  req = Request();
  req.mutable_spec()->set_device(std::string(kMaxNameBytes + 1, 'c'));
  ExpectRefused(req, "spec.device");
  req = Request();
  (*req.mutable_spec()->mutable_kernels())["rmsnorm"] = std::string(5000, 'f');
  ExpectRefused(req, "spec.kernels");
  req = Request();
  req.mutable_spec()->mutable_lora()->add_target_modules("q");
  req.mutable_spec()->mutable_lora()->add_target_modules(std::string(300, 'k'));
  ExpectRefused(req, "spec.lora.target_modules[1]");
  req = Request();
  const std::string q(1, 'q');
  for (int i = 0; i <= kMaxEntries; ++i) req.mutable_spec()->mutable_lora()->add_target_modules(q);
  ExpectRefused(req, "spec.lora.target_modules");
}

TEST(RequestLimits, InvalidUtf8IsRefusedByItsPath) {
  auto req = Request();
  req.set_name("bad \xff name");
  ExpectRefused(req, "name");
  req = Request();
  req.set_owner("\xc3");
  ExpectRefused(req, "owner");
  req = Request();
  req.mutable_spec()->mutable_data()->set_path("/data/\xed\xa0\x80.bin");  // a UTF-16 surrogate
  ExpectRefused(req, "spec.data.path");
  req = Request();
  req.set_name("naïve 训练 🚀");
  EXPECT_TRUE(CheckRequestStrings(req).ok());
}

// What the SubmitJob handler does with bytes protobuf's parser refused.
TEST(RequestLimits, FindInvalidUtf8NamesTheFieldInWireBytes) {
  auto req = Request();
  req.set_name("NAME");
  req.mutable_spec()->mutable_data()->set_path("PATH");
  (*req.mutable_spec()->mutable_kernels())["rope"] = "KVAL";
  const std::string wire = req.SerializeAsString();
  const auto* type = ftd::v1::SubmitJobRequest::descriptor();
  EXPECT_EQ(FindInvalidUtf8(type, wire), "");
  const auto corrupt = [&](const std::string& what) {
    std::string w = wire;
    const size_t at = w.find(what);
    w[at] = '\xff';
    w[at + 1] = '\xfe';
    ftd::v1::SubmitJobRequest parsed;
    EXPECT_FALSE(parsed.ParseFromString(w));  // what gRPC's own parse does
    return FindInvalidUtf8(type, w);
  };
  EXPECT_EQ(corrupt("NAME"), "name");
  EXPECT_EQ(corrupt("PATH"), "spec.data.path");
  EXPECT_EQ(corrupt("KVAL"), "spec.kernels");
  EXPECT_EQ(FindInvalidUtf8(type, "\x0a\xff\xff\xff"), "");  // truncated: not a string problem
}

TEST(RequestLimits, ClipKeepsHeadAndTailOnCharacterBoundaries) {
  EXPECT_EQ(Clip("short"), "short");
  const std::string big = "open " + std::string(10'000, 'x') + ": No such file or directory";
  const std::string c = Clip(big, 100);
  EXPECT_LT(c.size(), 140u);
  EXPECT_EQ(c.substr(0, 5), "open ");
  EXPECT_NE(c.find("(10032 bytes)"), std::string::npos) << c;
  EXPECT_EQ(c.substr(c.size() - 9), "directory");
  std::string euros;
  for (int i = 0; i < 100; ++i) euros += "€";  // 3 bytes each
  const std::string e = Clip(euros, 50);
  ftd::v1::SubmitJobRequest r;
  r.set_name(e);
  EXPECT_TRUE(CheckRequestStrings(r).ok()) << "cut inside a character: " << e;
}

}  // namespace
}  // namespace ftd::server

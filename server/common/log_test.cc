#include "server/common/log.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ftd/v1/jobs.pb.h"
#include "server/testing/fake_clock.h"

namespace ftd::server {
namespace {

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSinkForTest([this](const std::string& line) { lines.push_back(line); });
  }
  void TearDown() override { SetLogSinkForTest(nullptr); }
  std::vector<std::string> lines;
};

TEST_F(LogTest, ALineIsWrittenWholeWithItsControlCharactersEscaped) {
  const std::string name = "x\nftd: job j-000001 RUNNING -> SUCCEEDED (SUCCEEDED): forged line\x1b]0;owned\a";
  FtdLog() << "job j-000002 submitted: \"" << name << "\"";
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "ftd: job j-000002 submitted: \"x\\nftd: job j-000001 RUNNING -> SUCCEEDED (SUCCEEDED): forged "
            "line\\x1b]0;owned\\x07\"\n");
}

TEST_F(LogTest, ARateLimitedKindWritesItsBurstThenSaysHowManyWereLeftOut) {
  testing::FakeClock clock;
  RateLimitedLog log("refused connections", 3, &clock);
  for (int i = 0; i < 10; ++i) log.Write("refused " + std::to_string(i));
  EXPECT_EQ(lines, (std::vector<std::string>{"ftd: refused 0\n", "ftd: refused 1\n", "ftd: refused 2\n"}));
  clock.Advance(59'999);
  EXPECT_FALSE(log.Write("refused 10"));
  clock.Advance(1);
  EXPECT_TRUE(log.Write("refused 11"));
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[3], "ftd: 8 more lines about refused connections left out in the last minute\n");
  EXPECT_EQ(lines[4], "ftd: refused 11\n");
}

TEST_F(LogTest, ProtobufsOwnMessagesGoToTheLogRateLimited) {
  testing::FakeClock clock;
  RouteProtobufLog(&clock, 2);
  // A proto3 string that is not UTF-8: protobuf's parser logs an error for each.
  ftd::v1::GetJobRequest req;
  req.set_id("ABCD");
  std::string wire = req.SerializeAsString();
  wire.replace(wire.find("AB"), 2, "\xff\xfe");
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(ftd::v1::GetJobRequest().ParseFromString(wire));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(lines[0].starts_with("ftd: protobuf error: ")) << lines[0];
  EXPECT_NE(lines[0].find("invalid UTF-8"), std::string::npos) << lines[0];
}

}  // namespace
}  // namespace ftd::server

#include "client/render.h"

#include <gtest/gtest.h>

#include <sstream>

namespace ftd::client {
namespace {

TEST(Render, Durations) {
  EXPECT_EQ(FormatDuration(0), "0s");
  EXPECT_EQ(FormatDuration(59.4), "59s");
  EXPECT_EQ(FormatDuration(185), "3m05s");
  EXPECT_EQ(FormatDuration(7260), "2h01m");
  EXPECT_EQ(FormatDuration(-1), "?");
}

TEST(Render, Bytes) {
  EXPECT_EQ(FormatBytes(512ull << 20), "512 MiB");
  EXPECT_EQ(FormatBytes(3ull << 29), "1.5 GiB");
}

TEST(Render, StepLineShowsProgressThroughputMemoryAndEta) {
  ftd::v1::JobEvent e;
  auto* s = e.mutable_step();
  s->set_step(10);
  s->set_total_steps(30);
  s->set_loss(2.5);
  s->set_tokens_per_s(8192);
  s->set_step_time_s(1.5);
  s->set_peak_mem_allocated_bytes(3ull << 30);
  s->set_peak_mem_reserved_bytes(4ull << 30);
  const std::string line = EventLine(e);
  EXPECT_EQ(line.rfind("step 10/30  loss 2.5000", 0), 0u) << line;
  EXPECT_NE(line.find("8192 tokens/s"), std::string::npos) << line;
  EXPECT_NE(line.find("gpu 3.0 GiB / 4.0 GiB reserved"), std::string::npos) << line;
  EXPECT_NE(line.find("eta 30s"), std::string::npos) << line;  // 20 steps left x 1.5 s
}

TEST(Render, TableColumnsLineUp) {
  ftd::v1::Job a, b;
  a.set_id("j-000001");
  a.set_name("a-much-longer-name");
  a.set_state(ftd::v1::RUNNING);
  b.set_id("j-000002");
  b.set_state(ftd::v1::QUEUED);
  const std::string t = JobsTable({a, b});
  std::istringstream in(t);
  std::string header, r1, r2;
  std::getline(in, header);
  std::getline(in, r1);
  std::getline(in, r2);
  EXPECT_EQ(header.find("STATE"), r1.find("RUNNING"));
  EXPECT_EQ(header.find("STATE"), r2.find("QUEUED"));
}

TEST(Render, JsonUsesProtoFieldNamesAndKeepsZeroes) {
  ftd::v1::Job j;
  j.set_id("j-000003");
  j.set_state(ftd::v1::SUCCEEDED);
  const std::string s = ToJson(j, false);
  EXPECT_NE(s.find("\"queue_position\""), std::string::npos) << s;
  EXPECT_NE(s.find("\"state\":\"SUCCEEDED\""), std::string::npos) << s;
}

TEST(Render, ExitCodes) {
  EXPECT_EQ(ExitCodeForState(ftd::v1::SUCCEEDED), 0);
  EXPECT_EQ(ExitCodeForState(ftd::v1::FAILED), 1);
  EXPECT_EQ(ExitCodeForState(ftd::v1::CANCELLED), 2);
  EXPECT_EQ(ExitCodeForState(ftd::v1::RUNNING), 3);
}

}  // namespace
}  // namespace ftd::client

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
  const std::string t = JobsTable({a, b}, 0);
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

TEST(Render, JsonIntegersAreNumbers) {
  ftd::v1::Job j;
  j.set_created_unix_ms(1764000000123);
  j.mutable_spec()->set_steps(20);
  j.mutable_spec()->mutable_data()->set_seed(18446744073709551615ull);
  j.mutable_last_step()->set_tokens_total(4096);
  const auto v = ToJsonValue(j);
  EXPECT_TRUE(v["created_unix_ms"].is_number_integer()) << v.dump();
  EXPECT_EQ(v["created_unix_ms"].get<int64_t>(), 1764000000123);
  EXPECT_EQ(v["spec"]["steps"].get<int64_t>(), 20);
  EXPECT_EQ(v["spec"]["data"]["seed"].get<uint64_t>(), 18446744073709551615ull);
  EXPECT_EQ(v["last_step"]["tokens_total"].get<int64_t>(), 4096);
  EXPECT_NE(ToJson(j, false).find("\"created_unix_ms\":1764000000123"), std::string::npos);
  EXPECT_EQ(ToJson(j, false).find("\"id\""), 1u) << "keys keep the .proto order";
}

TEST(Render, AgeAndDuration) {
  ftd::v1::Job run, done, queued;
  run.set_id("j-1");
  run.set_created_unix_ms(1000);
  run.set_started_unix_ms(61000);
  done = run;
  done.set_id("j-2");
  done.set_finished_unix_ms(3661000);
  queued.set_id("j-3");
  queued.set_created_unix_ms(3600000);
  EXPECT_EQ(JobDurationS(run, 121000), 60);
  EXPECT_EQ(JobDurationS(done, 9999999), 3600);
  EXPECT_LT(JobDurationS(queued, 9999999), 0);
  const std::string t = JobsTable({run, done, queued}, 3601000);
  EXPECT_NE(t.find("AGE"), std::string::npos);
  EXPECT_NE(t.find("DURATION"), std::string::npos);
  EXPECT_NE(t.find("1h00m  59m00s"), std::string::npos) << t;  // j-1: created 1 h ago, running for 59 min
  EXPECT_NE(t.find("1h00m  1h00m"), std::string::npos) << t;   // j-2: finished after 1 h
  EXPECT_NE(JobText(run, 121000).find("duration:       1m00s so far"), std::string::npos) << JobText(run, 121000);
  EXPECT_NE(JobText(done, 0).find("duration:       1h00m\n"), std::string::npos) << JobText(done, 0);
}

TEST(Render, ExitCodes) {
  EXPECT_EQ(ExitCodeForState(ftd::v1::SUCCEEDED), 0);
  EXPECT_EQ(ExitCodeForState(ftd::v1::FAILED), 1);
  EXPECT_EQ(ExitCodeForState(ftd::v1::CANCELLED), 2);
  EXPECT_EQ(ExitCodeForState(ftd::v1::RUNNING), 3);
}

}  // namespace
}  // namespace ftd::client

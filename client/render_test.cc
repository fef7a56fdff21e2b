#include "client/render.h"

#include <gtest/gtest.h>

#include <cstdlib>
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
  // Small sizes keep their digits: a tiny model is not "0 MiB".
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(812), "812 B");
  EXPECT_EQ(FormatBytes(300ull << 10), "300 KiB");
  EXPECT_EQ(FormatBytes((32ull << 20) / 10), "3.2 MiB");
  EXPECT_EQ(FormatBytes(48ull << 30), "48.0 GiB");
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

ftd::v1::StepReport WideStep() {
  ftd::v1::StepReport s;
  s.set_step(10);
  s.set_total_steps(30);
  s.set_loss(2.5);
  s.set_grad_norm(0.75);
  s.set_lr(1e-4);
  s.set_tokens_per_s(8192);
  s.set_step_time_s(1.5);
  s.set_peak_mem_allocated_bytes(3ull << 30);
  s.set_peak_mem_reserved_bytes(4ull << 30);
  s.set_mfu(0.41);
  s.set_nvml_available(true);
  s.set_power_w(650);
  s.set_joules_per_token(0.08);
  return s;
}

TEST(Render, LiveLineFitsTheTerminalKeepingTheMostImportantFields) {
  const auto s = WideStep();
  for (int width : {200, 120, 80, 60, 40, 30, 20, 10, 2}) {
    const std::string line = LiveStepLine(s, -1, width);
    EXPECT_LT(line.size(), static_cast<size_t>(width)) << width << ": " << line;
    EXPECT_EQ(line.find('\n'), std::string::npos);
  }
  const std::string wide = LiveStepLine(s, -1, 200);
  EXPECT_EQ(wide, EventLine([&] {
              ftd::v1::JobEvent e;
              *e.mutable_step() = s;
              return e;
            }()));
  EXPECT_NE(wide.find("650 W"), std::string::npos) << wide;
  const std::string line80 = LiveStepLine(s, -1, 80);
  EXPECT_EQ(line80.rfind("step 10/30  loss 2.5000  eta 30s  8192 tokens/s", 0), 0u) << line80;
  EXPECT_EQ(line80.find("650 W"), std::string::npos) << "the least important field goes first: " << line80;
  EXPECT_EQ(LiveStepLine(s, -1, 40), "step 10/30  loss 2.5000  eta 30s");
  EXPECT_EQ(LiveStepLine(s, -1, 8), "step 10");  // not even the first field fits: cut
}

TEST(Render, EtaUsesTheSmoothedStepTime) {
  StepTimeEwma ewma(0.5);
  EXPECT_LT(ewma.seconds(), 0);
  ftd::v1::StepReport s;
  s.set_total_steps(100);
  s.set_step(1);
  s.set_step_time_s(1.0);
  ewma.Add(s);
  EXPECT_DOUBLE_EQ(ewma.seconds(), 1.0);
  s.set_step(2);
  s.set_step_time_s(9.0);  // one slow step (a checkpoint)
  ewma.Add(s);
  EXPECT_DOUBLE_EQ(ewma.seconds(), 5.0);
  ewma.Add(s);  // the same report again (a watch resumed): not counted twice
  EXPECT_DOUBLE_EQ(ewma.seconds(), 5.0);
  s.set_step(3);
  s.set_step_time_s(1.0);
  ewma.Add(s);
  EXPECT_DOUBLE_EQ(ewma.seconds(), 3.0);
  s.set_step(4);
  s.set_step_time_s(0);  // no time measured: ignored
  ewma.Add(s);
  EXPECT_DOUBLE_EQ(ewma.seconds(), 3.0);
  // 96 steps left: 96 x 3 s with the average, 96 x 1 s with the last step's time alone.
  s.set_step_time_s(1.0);
  EXPECT_NE(LiveStepLine(s, ewma.seconds(), 200).find("eta 4m48s"), std::string::npos) << LiveStepLine(s, ewma.seconds(), 200);
  ftd::v1::JobEvent e;
  *e.mutable_step() = s;
  EXPECT_NE(EventLine(e, ewma.seconds()).find("eta 4m48s"), std::string::npos);
  EXPECT_NE(EventLine(e).find("eta 1m36s"), std::string::npos);
}

TEST(Render, TerminalColumnsFallsBackToColumnsThen80) {
  const int not_a_terminal = -1;
  setenv("COLUMNS", "132", 1);
  EXPECT_EQ(TerminalColumns(not_a_terminal), 132);
  setenv("COLUMNS", "junk", 1);
  EXPECT_EQ(TerminalColumns(not_a_terminal), 80);
  unsetenv("COLUMNS");
  EXPECT_EQ(TerminalColumns(not_a_terminal), 80);
}

TEST(Render, GetShowsACheckpointWriteWithItsPredictedEnd) {
  ftd::v1::Job j;
  j.set_state(ftd::v1::RUNNING);
  EXPECT_EQ(JobText(j, 0).find("phase:"), std::string::npos);
  auto* p = j.mutable_phase();
  p->set_phase("save_checkpoint");
  p->set_after_step(4);
  p->set_done_bytes(int64_t{12} << 30);
  p->set_total_bytes(int64_t{48} << 30);
  EXPECT_NE(JobText(j, 0).find("phase:          save_checkpoint after step 4: 12.0 GiB of 48.0 GiB\n"),
            std::string::npos) << JobText(j, 0);
  p->set_eta_s(25.2);
  EXPECT_NE(JobText(j, 0).find("12.0 GiB of 48.0 GiB, about 26s left\n"), std::string::npos) << JobText(j, 0);
}

TEST(Render, GetOfAnotherUsersJobSaysWhoSeesTheRest) {
  ftd::v1::Job j;
  j.set_owner("alice");
  EXPECT_EQ(JobText(j, 0).find("private:"), std::string::npos);
  j.set_public_only(true);
  EXPECT_NE(JobText(j, 0).find("private:        the spec, messages, logs, trace and profile are visible to alice and "
                               "admins only\n"),
            std::string::npos)
      << JobText(j, 0);
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

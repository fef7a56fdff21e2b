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
    const std::string line = LiveStepLine(s, width);
    EXPECT_LT(line.size(), static_cast<size_t>(width)) << width << ": " << line;
    EXPECT_EQ(line.find('\n'), std::string::npos);
  }
  const std::string wide = LiveStepLine(s, 200);
  EXPECT_EQ(wide, EventLine([&] {
              ftd::v1::JobEvent e;
              *e.mutable_step() = s;
              return e;
            }()));
  EXPECT_NE(wide.find("650 W"), std::string::npos) << wide;
  const std::string line80 = LiveStepLine(s, 80);
  EXPECT_EQ(line80.rfind("step 10/30  loss 2.5000  eta 30s  8192 tokens/s", 0), 0u) << line80;
  EXPECT_EQ(line80.find("650 W"), std::string::npos) << "the least important field goes first: " << line80;
  EXPECT_EQ(LiveStepLine(s, 40), "step 10/30  loss 2.5000  eta 30s");
  EXPECT_EQ(LiveStepLine(s, 8), "step 10");  // not even the first field fits: cut
}

// The worker computes the ETA once (StepReport.eta_s: the steps left at its moving average of every
// step's time); watch's lines and get's "last step" show that one, however many reports each saw.
TEST(Render, GetAndWatchShowTheWorkersOneEta) {
  std::vector<ftd::v1::JobEvent> events;  // what a watch shows, in order
  for (int step = 1; step <= 4; ++step) {
    ftd::v1::JobEvent e;
    auto* s = e.mutable_step();
    s->set_step(step);
    s->set_total_steps(100);
    s->set_step_time_s(step == 3 ? 9.0 : 1.0);  // one slow step (a checkpoint, an evaluation)
    s->set_eta_s(164.4 - step);                 // the worker's figure, whatever it is
    events.push_back(e);
  }
  ftd::v1::Job job;  // what get shows: the last report only
  *job.mutable_last_step() = events.back().step();
  std::string watched;
  for (const auto& e : events) watched = EventLine(e);
  EXPECT_NE(watched.find("eta 2m40s"), std::string::npos) << watched;  // 160.4 s
  EXPECT_NE(LiveStepLine(events.back().step(), 200).find("eta 2m40s"), std::string::npos);
  EXPECT_NE(JobText(job, 0).find("last step:      " + watched + "\n"), std::string::npos) << JobText(job, 0);
  // A report from a worker without the field: the steps left at that step's time.
  ftd::v1::StepReport old = events.back().step();
  old.clear_eta_s();
  EXPECT_DOUBLE_EQ(StepEtaSeconds(old), 96.0);
}

// The held-out loss where it was measured: on the watch's step line (after the loss, kept on a
// narrow terminal before the rest), on get's last step, and the final one on the result line.
TEST(Render, HeldOutLossOnStepAndResultLines) {
  ftd::v1::JobEvent e;
  *e.mutable_step() = WideStep();
  EXPECT_EQ(EventLine(e).find("eval_loss"), std::string::npos) << "not measured at this step";
  e.mutable_step()->set_eval_loss(2.71828);
  EXPECT_EQ(EventLine(e).rfind("step 10/30  loss 2.5000  eval_loss 2.7183  eta ", 0), 0u) << EventLine(e);
  EXPECT_EQ(LiveStepLine(e.step(), 60).rfind("step 10/30  loss 2.5000  eval_loss 2.7183", 0), 0u);
  ftd::v1::Job j;
  j.set_state(ftd::v1::SUCCEEDED);
  *j.mutable_last_step() = e.step();
  auto* r = j.mutable_result();
  r->set_outcome(ftd::v1::RunResult::SUCCEEDED);
  r->set_message("trained 30 steps");
  EXPECT_NE(JobText(j, 0).find("result:         SUCCEEDED: trained 30 steps\n"), std::string::npos) << JobText(j, 0);
  r->set_final_eval_loss(2.5);
  const std::string get = JobText(j, 0);
  EXPECT_NE(get.find("result:         SUCCEEDED: trained 30 steps; final_eval_loss 2.5000\n"), std::string::npos) << get;
  EXPECT_NE(get.find("eval_loss 2.7183"), std::string::npos) << get;  // the last step's
  ftd::v1::JobEvent result;
  *result.mutable_result() = *r;
  EXPECT_NE(EventLine(result).find("result: SUCCEEDED: trained 30 steps; final_eval_loss 2.5000"), std::string::npos)
      << EventLine(result);
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

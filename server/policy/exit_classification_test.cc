#include "server/policy/exit_classification.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "server/jobs/metrics.h"
#include "server/store/store.h"

namespace ftd::server {
namespace {

using ftd::v1::RunResult;

WorkerEnd Ended(std::optional<RunResult::Outcome> reported, ExitStatus exit) {
  WorkerEnd e;
  if (reported.has_value()) {
    e.result = RunResult();
    e.result->set_outcome(*reported);
    e.result->set_message("reported text");
  }
  e.exit = exit;
  return e;
}
constexpr ExitStatus kExit0{false, 0, 0};
constexpr ExitStatus kExit1{false, 1, 0};
constexpr ExitStatus kExit5{false, 5, 0};
constexpr ExitStatus kKilled{true, 0, SIGKILL};

Reason Of(const WorkerEnd& e) { return Classify(e, 1, 30).reason; }

TEST(ExitClassification, EveryReasonHasOneRowAndEveryRuleAReason) {
  std::map<Reason, int> rows;
  for (const auto& r : kReasons) ++rows[r.reason];
  for (int r = 0; r <= static_cast<int>(Reason::kDaemonShutdown); ++r) {
    EXPECT_EQ(rows[static_cast<Reason>(r)], 1) << "reason #" << r;
    EXPECT_EQ(Info(static_cast<Reason>(r)).reason, static_cast<Reason>(r));
  }
  for (const auto& rule : kExitRules) EXPECT_EQ(rows.count(rule.reason), 1u);
  const ExitRule& last = kExitRules[std::size(kExitRules) - 1];
  EXPECT_TRUE(last.asked == Asked::kAny && last.reported == kAnyReport && last.ended == Ended::kAny)
      << "the last rule must match every ending";
}

TEST(ExitClassification, TheWorkersReportDecidesItsOwnOutcomes) {
  EXPECT_EQ(Of(Ended(RunResult::SUCCEEDED, kExit0)), Reason::kSucceeded);
  EXPECT_EQ(Of(Ended(RunResult::OUT_OF_MEMORY, ExitStatus{false, 3, 0})), Reason::kGpuOutOfMemory);
  EXPECT_EQ(Of(Ended(RunResult::INVALID_SPEC, ExitStatus{false, 2, 0})), Reason::kInvalidSpec);
  EXPECT_EQ(Of(Ended(RunResult::NON_FINITE, ExitStatus{false, 4, 0})), Reason::kNonFinite);
  EXPECT_EQ(Of(Ended(RunResult::FAILED, kExit1)), Reason::kWorkerError);
  // A report, however the process then ends, is the job's own outcome and final.
  EXPECT_EQ(Of(Ended(RunResult::OUT_OF_MEMORY, kKilled)), Reason::kGpuOutOfMemory);
  EXPECT_TRUE(Classify(Ended(RunResult::OUT_OF_MEMORY, kKilled), 1, 30).from_report);
}

TEST(ExitClassification, SuccessNeedsACleanExit) {
  EXPECT_EQ(Of(Ended(RunResult::SUCCEEDED, kKilled)), Reason::kKilledBySignal);
  EXPECT_EQ(Of(Ended(RunResult::SUCCEEDED, kExit1)), Reason::kWorkerExit);
  EXPECT_FALSE(Classify(Ended(RunResult::SUCCEEDED, kKilled), 1, 30).from_report);
}

TEST(ExitClassification, WithoutAReportTheProcessEndingDecides) {
  EXPECT_EQ(Of(Ended(std::nullopt, kKilled)), Reason::kKilledBySignal);
  EXPECT_EQ(Of(Ended(std::nullopt, kExit5)), Reason::kWorkerExit);
  WorkerEnd never = Ended(std::nullopt, {});
  never.started = false;
  never.start_error = "cannot start /x/ftd-worker: No such file or directory";
  const Verdict v = Classify(never, 1, 30);
  EXPECT_EQ(v.reason, Reason::kSpawnFailed);
  EXPECT_NE(v.message.find("/x/ftd-worker"), std::string::npos) << v.message;
}

TEST(ExitClassification, WhatTheDaemonAskedComesFirst) {
  WorkerEnd e = Ended(RunResult::FAILED, kExit1);
  e.cancel = true;
  EXPECT_EQ(Of(e), Reason::kCancelled);
  e.drain = true;  // cancelled, then the daemon drained: the job goes back to the queue
  EXPECT_EQ(Of(e), Reason::kDaemonShutdown);
  WorkerEnd lost = Ended(std::nullopt, kKilled);
  lost.heartbeat_lost = true;  // the daemon's own SIGKILL is not a crash
  EXPECT_EQ(Of(lost), Reason::kLostHeartbeat);
  EXPECT_NE(Classify(lost, 1, 4.5).message.find("4.5s"), std::string::npos);
  lost.result = RunResult();
  lost.result->set_outcome(RunResult::OUT_OF_MEMORY);  // it had reported before going silent
  EXPECT_EQ(Of(lost), Reason::kGpuOutOfMemory);
}

TEST(ExitClassification, AStuckWorkerIsItsOwnOutcomeAndNotRetried) {
  WorkerEnd stuck = Ended(std::nullopt, kKilled);
  stuck.no_progress = true;  // the watchdog's own SIGKILL is not a crash
  stuck.no_progress_detail = "no step for 600s";
  const Verdict v = Classify(stuck, 1, 30);
  EXPECT_EQ(v.reason, Reason::kNoProgress);
  EXPECT_EQ(v.message, "stuck: no step for 600s; its process group was killed");
  EXPECT_EQ(Info(Reason::kNoProgress).retry, Retry::kNever);
  EXPECT_EQ(Info(Reason::kNoProgress).final_state, ftd::v1::FAILED);
  stuck.cancel = true;  // cancelled meanwhile: the cancel is what the client sees
  EXPECT_EQ(Of(stuck), Reason::kCancelled);
}

TEST(ExitClassification, MessagesSayWhatHappened) {
  EXPECT_EQ(Classify(Ended(std::nullopt, kKilled), 1, 30).message, "worker killed by signal 9 (SIGKILL)");
  EXPECT_EQ(Classify(Ended(std::nullopt, kExit5), 1, 30).message,
            "worker ended with exit code 5 before reporting a result");
  EXPECT_EQ(Classify(Ended(RunResult::FAILED, kExit1), 1, 30).message, "reported text (worker exit code 1)");
}

// A worker that could not be started because ftd itself was out of descriptors or memory is not the
// job's failure: requeued after a pause, not counted; any other start failure is SPAWN_FAILED.
TEST(ExitClassification, ALaunchTheDaemonWasTooShortForIsNotTheJobsAttempt) {
  WorkerEnd short_of;
  short_of.started = false;
  short_of.start_short = true;
  short_of.start_error = "cannot start ftd-worker: pipe: Too many open files";
  const Verdict v = Classify(short_of, 1, 30);
  EXPECT_EQ(v.reason, Reason::kDaemonShort);
  EXPECT_EQ(Info(v.reason).retry, Retry::kFreeAfterBackoff);
  EXPECT_EQ(Info(v.reason).final_state, ftd::v1::QUEUED);
  EXPECT_EQ(v.message,
            "ftd could not start the worker for want of a resource of its own (cannot start ftd-worker: pipe: Too many "
            "open files); the attempt is not counted and the job is retried after a pause");
  short_of.start_short = false;
  EXPECT_EQ(Classify(short_of, 1, 30).reason, Reason::kSpawnFailed);
  short_of.start_short = true;
  short_of.cancel = true;
  EXPECT_EQ(Classify(short_of, 1, 30).reason, Reason::kCancelled);
}

// A worker stopped by a SIGTERM that ftd did not send reports CANCELLED and exits 5: the job was
// cancelled from outside, not an infrastructure failure to retry.
TEST(ExitClassification, AnExternalStopIsACancel) {
  const Verdict v = Classify(Ended(RunResult::CANCELLED, kExit5), 1, 30);
  EXPECT_EQ(v.reason, Reason::kCancelled);
  EXPECT_TRUE(v.from_report);
  EXPECT_NE(v.message.find("from outside ftd"), std::string::npos) << v.message;
  EXPECT_NE(v.message.find("exit code 5"), std::string::npos) << v.message;
  EXPECT_EQ(v.message.find("before reporting"), std::string::npos) << v.message;
  // Killed after its report: still the report's outcome.
  EXPECT_EQ(Of(Ended(RunResult::CANCELLED, kKilled)), Reason::kCancelled);
  // A report followed by an exit that contradicts it says that it reported.
  EXPECT_EQ(Classify(Ended(RunResult::SUCCEEDED, kExit1), 1, 30).message,
            "worker ended with exit code 1 after reporting SUCCEEDED");
}

TEST(ExitClassification, RetryDelayDoublesUpToTheCap) {
  EXPECT_EQ(RetryDelayMs(1, 2000, 60000), 2000);
  EXPECT_EQ(RetryDelayMs(2, 2000, 60000), 4000);
  EXPECT_EQ(RetryDelayMs(5, 2000, 60000), 32000);
  EXPECT_EQ(RetryDelayMs(6, 2000, 60000), 60000);
  EXPECT_EQ(RetryDelayMs(40, 2000, 60000), 60000);
}

// The metrics' closed label sets are the table's: a completion series per reason that ends a job,
// a retry series per reason that is retried, and nothing else.
TEST(ExitClassification, MetricsLabelSetsComeFromTheTable) {
  Metrics m;
  std::set<std::pair<std::string, std::string>> completions;
  std::set<std::string> retries;
  for (const auto& f : m.registry()->Collect()) {
    for (const auto& metric : f.metric) {
      std::map<std::string, std::string> l;
      for (const auto& lp : metric.label) l[lp.name] = lp.value;
      if (f.name == "ftd_job_completions_total") completions.insert({l["state"], l["outcome"]});
      if (f.name == "ftd_job_retries_total") retries.insert(l["reason"]);
    }
  }
  std::set<std::pair<std::string, std::string>> want_completions;
  std::set<std::string> want_retries;
  for (const auto& r : kReasons) {
    std::string code(r.code);
    for (auto& c : code) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (IsTerminal(r.final_state)) want_completions.insert({StateLabel(r.final_state), code});
    if (r.retry == Retry::kWhileAttemptsLeft) want_retries.insert(code);
  }
  EXPECT_EQ(completions, want_completions);
  EXPECT_EQ(retries, want_retries);
  EXPECT_EQ(want_completions.size(), 13u);
}

// docs/api.md's reason table lists every reason with the same retry rule.
TEST(ExitClassification, TheApiDocumentListsEveryReason) {
  std::ifstream in(std::string(FTD_SOURCE_DIR) + "/docs/api.md");
  ASSERT_TRUE(in) << "docs/api.md";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  std::map<std::string, std::pair<std::string, std::string>> rows;  // reason -> (states, retried)
  const std::regex row(R"(\| `([A-Z_]+)` \| ([^|]*)\|[^|]*\| ([^|]*)\|)");
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), row); it != std::sregex_iterator(); ++it) {
    rows[(*it)[1]] = {(*it)[2], (*it)[3]};
  }
  ASSERT_GT(rows.size(), 10u) << "docs/api.md's reason table not found";
  std::set<std::string> in_table;
  for (const auto& r : kReasons) {
    const std::string code(r.code);
    in_table.insert(code);
    auto it = rows.find(code);
    ASSERT_NE(it, rows.end()) << code << " is missing from docs/api.md";
    const std::string& retried = it->second.second;
    switch (r.retry) {
      case Retry::kNever: EXPECT_TRUE(retried.find("yes") == std::string::npos) << code << ": " << retried; break;
      case Retry::kWhileAttemptsLeft:
        EXPECT_TRUE(retried.find("yes") != std::string::npos || retried.find("per policy") != std::string::npos)
            << code << ": " << retried;
        break;
      case Retry::kFree:
      case Retry::kFreeAfterBackoff:
        EXPECT_NE(retried.find("always"), std::string::npos) << code << ": " << retried;
        break;
    }
  }
  for (const auto& [code, cols] : rows) {
    const bool ends = cols.first.find("FAILED") != std::string::npos || cols.first.find("SUCCEEDED") != std::string::npos ||
                      (cols.first.find("CANCELLED") != std::string::npos && code != "CANCELLING");
    if (ends) {
      EXPECT_EQ(in_table.count(code), 1u) << code << " is documented but not in kReasons";
    }
  }
}

// The failing-jobs alerts count exactly the reasons whose fault is the service's: a user's invalid
// spec, diverging run or too large a job alerts no operator. Each of their outcome matchers in
// deploy/prometheus/alerts.yml lists those reasons (the rules' behaviour: alerts_test.yml).
TEST(ExitClassification, TheFailingJobsAlertsCountTheServicesFaultsOnly) {
  std::ifstream in(std::string(FTD_SOURCE_DIR) + "/deploy/prometheus/alerts.yml");
  ASSERT_TRUE(in) << "deploy/prometheus/alerts.yml";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string rules = ss.str();
  std::set<std::string> service;
  for (const auto& r : kReasons) {
    std::string code(r.code);
    for (auto& c : code) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (r.fault == Fault::kService) service.insert(code);
    if (r.fault != Fault::kNone) {
      EXPECT_EQ(r.final_state, ftd::v1::FAILED) << code;
    }
  }
  EXPECT_TRUE(service.count("worker_error") && !service.count("invalid_spec") && !service.count("non_finite"));
  for (const std::string alert : {"FtdJobsFailing", "FtdJobFailureRatioHigh"}) {
    const size_t begin = rules.find("- alert: " + alert + "\n");
    ASSERT_NE(begin, std::string::npos) << alert;
    const std::string block = rules.substr(begin, rules.find("- alert:", begin + 1) - begin);
    const std::regex matcher(R"re(state="failed"([^}]*)\})re");
    int failed_selectors = 0;
    for (auto it = std::sregex_iterator(block.begin(), block.end(), matcher); it != std::sregex_iterator(); ++it) {
      ++failed_selectors;
      std::smatch outcome;
      const std::string labels = (*it)[1];
      ASSERT_TRUE(std::regex_search(labels, outcome, std::regex(R"re(outcome=~"([a-z_|]+)")re")))
          << alert << ": a selector of failed jobs without an outcome=~ matcher: " << labels;
      std::set<std::string> listed;
      std::stringstream codes(outcome[1]);
      for (std::string code; std::getline(codes, code, '|');) listed.insert(code);
      EXPECT_EQ(listed, service) << alert;
    }
    EXPECT_GE(failed_selectors, 2) << alert;
  }
}

}  // namespace
}  // namespace ftd::server

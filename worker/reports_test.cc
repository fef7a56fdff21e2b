// The engine's vocabulary against the protocol's: each list is defined once (StepMetrics' fields in
// FTD_STEP_METRICS, outcomes in spec/run_outcome.h) and these tests fail when a value is added on
// one side only.
#include "worker/reports.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace ftd::worker {
namespace {

TEST(Reports, StepReportHasExactlyTheStepMetricsFieldsInOrder) {
  std::vector<std::string> metrics;
#define FTD_STEP_METRICS_NAME(type, name, meaning) metrics.push_back(#name);
  FTD_STEP_METRICS(FTD_STEP_METRICS_NAME)
#undef FTD_STEP_METRICS_NAME
  const auto* d = ftd::v1::StepReport::descriptor();
  std::vector<std::string> proto;
  for (int i = 0; i < d->field_count(); ++i) proto.push_back(std::string(d->field(i)->name()));
  EXPECT_EQ(metrics, proto);
}

TEST(Reports, EveryStepMetricReachesTheReport) {
  engine::StepMetrics m;
  int i = 0;
  // A distinct non-zero value per field (bools true), so a field the report drops or swaps shows.
#define FTD_STEP_METRICS_FILL(type, name, meaning) m.name = static_cast<type>(++i);
  FTD_STEP_METRICS(FTD_STEP_METRICS_FILL)
#undef FTD_STEP_METRICS_FILL
  const auto r = ToStepReport(m);
  const auto* refl = r.GetReflection();
  const auto* d = r.GetDescriptor();
  for (int f = 0; f < d->field_count(); ++f) {
    const auto* fd = d->field(f);
    double got = 0;
    switch (fd->cpp_type()) {
      case google::protobuf::FieldDescriptor::CPPTYPE_INT64: got = static_cast<double>(refl->GetInt64(r, fd)); break;
      case google::protobuf::FieldDescriptor::CPPTYPE_UINT64: got = static_cast<double>(refl->GetUInt64(r, fd)); break;
      case google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE: got = refl->GetDouble(r, fd); break;
      case google::protobuf::FieldDescriptor::CPPTYPE_BOOL: got = refl->GetBool(r, fd) ? f + 1 : 0; break;
      default: ADD_FAILURE() << "unexpected type of StepReport." << fd->name();
    }
    EXPECT_EQ(got, f + 1) << "StepReport." << fd->name();
  }
}

TEST(Reports, EveryOutcomeHasItsRunResultValueAndBack) {
  std::set<int> mapped;
  for (const auto& o : spec::kOutcomes) {
    ftd::v1::RunResult::Outcome p = ftd::v1::RunResult::OUTCOME_UNSPECIFIED;
    ASSERT_TRUE(ftd::v1::RunResult::Outcome_Parse(std::string(o.name), &p)) << o.name << " is not a RunResult outcome";
    EXPECT_EQ(ToProto(o.outcome), p);
    EXPECT_TRUE(mapped.insert(p).second);
  }
  const auto* e = ftd::v1::RunResult::Outcome_descriptor();
  for (int i = 0; i < e->value_count(); ++i) {
    if (e->value(i)->number() == ftd::v1::RunResult::OUTCOME_UNSPECIFIED) continue;
    EXPECT_TRUE(spec::ParseOutcome(e->value(i)->name()).has_value())
        << "RunResult." << e->value(i)->name() << " has no row in spec/run_outcome.h";
  }
  // Exit codes are distinct, and 0 is success only.
  std::set<int> codes;
  for (const auto& o : spec::kOutcomes) {
    EXPECT_TRUE(codes.insert(o.exit_code).second) << o.name;
    EXPECT_EQ(o.exit_code == 0, o.outcome == spec::Outcome::kSucceeded) << o.name;
    EXPECT_EQ(static_cast<size_t>(o.outcome), &o - spec::kOutcomes) << "rows in enumerator order";
  }
}

}  // namespace
}  // namespace ftd::worker

// The NVML monitor without NVML, and the energy window's per-step figures.
#include "worker/engine/core/gpu_monitor.h"

#include <gtest/gtest.h>

namespace ftd::engine {
namespace {

TEST(GpuMonitor, MissingNvmlIsUnavailableWithAReason) {
  auto m = GpuMonitor::Open("0000:00:00.0", "libnvidia-ml-that-does-not-exist.so.1");
  EXPECT_FALSE(m->available());
  EXPECT_NE(m->reason().find("NVML not loaded"), std::string::npos) << m->reason();
  EXPECT_FALSE(m->Read().ok);
}

TEST(EnergyWindow, PerStepFiguresSpanWholeStepsOverAtLeastTheWindow) {
  EnergyWindow w(1.0);
  w.Start(/*t=*/0.0, /*energy=*/100.0, /*tokens=*/0, /*step=*/0);
  w.AddStep(0.5, 150.0, 1000, 1);  // shorter than the window: measured from the start
  auto s = w.Current();
  EXPECT_DOUBLE_EQ(s.energy_total_j, 50.0);
  EXPECT_DOUBLE_EQ(s.step_energy_j, 50.0);
  EXPECT_DOUBLE_EQ(s.joules_per_token, 0.05);
  EXPECT_DOUBLE_EQ(s.power_w, 100.0);
  w.AddStep(1.0, 200.0, 2000, 2);
  EXPECT_DOUBLE_EQ(w.Current().step_energy_j, 50.0);
  w.AddStep(1.5, 300.0, 3000, 3);  // the newest steps spanning >= 1 s: from t=0.5 to t=1.5
  s = w.Current();
  EXPECT_DOUBLE_EQ(s.energy_total_j, 200.0);
  EXPECT_DOUBLE_EQ(s.step_energy_j, 75.0);
  EXPECT_DOUBLE_EQ(s.joules_per_token, 0.075);
  EXPECT_DOUBLE_EQ(s.power_w, 150.0);
  w.AddStep(3.0, 450.0, 4000, 4);  // one long step is a window of its own
  s = w.Current();
  EXPECT_DOUBLE_EQ(s.step_energy_j, 150.0);
  EXPECT_DOUBLE_EQ(s.power_w, 100.0);
}

// A data-parallel job's GPUs as one: energy, power and memory summed, utilisation averaged; nothing
// when one GPU could not be read (a partial sum would understate the job).
TEST(CombineGpuSamples, SumsTheJobsGpusAndNeedsEveryOne) {
  GpuMonitor::Sample a{true, 1000.0, 100.0, 0.2, 1ull << 30}, b{true, 500.0, 300.0, 0.6, 3ull << 30};
  auto job = CombineGpuSamples({a, b});
  EXPECT_TRUE(job.ok);
  EXPECT_DOUBLE_EQ(job.energy_j, 1500.0);
  EXPECT_DOUBLE_EQ(job.power_w, 400.0);
  EXPECT_DOUBLE_EQ(job.utilization, 0.4);
  EXPECT_EQ(job.memory_used_bytes, 4ull << 30);
  const auto one = CombineGpuSamples({a});
  EXPECT_TRUE(one.ok && one.energy_j == a.energy_j && one.utilization == a.utilization);
  b.ok = false;
  EXPECT_FALSE(CombineGpuSamples({a, b}).ok);
  EXPECT_EQ(CombineGpuSamples({a, b}).energy_j, 0.0);
  EXPECT_FALSE(CombineGpuSamples({}).ok);
}

}  // namespace
}  // namespace ftd::engine

// The NVML monitor without NVML, and the energy window's per-step figures.
#include "worker/engine/gpu_monitor.h"

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

}  // namespace
}  // namespace ftd::engine

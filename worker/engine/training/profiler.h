// Step profiling through LibTorch's profiler (Kineto): per-op self device and host time, split into
// the forward, backward and optimizer phases and mapped onto op categories, plus the Chrome/Perfetto
// trace. The trainer marks phases and the model marks op families with record-function scopes
// (ftd::phase::<phase>, ftd::op::<category>); our fused kernels record ftd::<family>_forward/_backward.
#pragma once

#include <string>

#include "worker/engine/engine.h"

namespace ftd::engine {

// Record-function scope names (also what the trace shows).
inline constexpr const char* kPhaseForward = "ftd::phase::forward";
inline constexpr const char* kPhaseBackward = "ftd::phase::backward";
inline constexpr const char* kPhaseOptimizer = "ftd::phase::optimizer";

class StepProfiler {
 public:
  explicit StepProfiler(bool cuda) : cuda_(cuda) {}
  void Start();
  // Stops, analyses `steps` profiled steps, writes the trace to trace_path (if not empty).
  ProfileSummary Stop(int steps, double wall_ms_per_step, const std::string& trace_path);

 private:
  bool cuda_;
};

// The closed set of op categories (metrics label values) and the mapping used for them.
std::string CategoryOfOpName(const std::string& op_name);

}  // namespace ftd::engine

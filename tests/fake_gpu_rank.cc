// ftd-fake-gpu-rank: a test driver that runs one rank of a job through the engine, as
// `ftd-worker run SPEC --rank RANK --store STORE` does, with a fake GPU monitor in place of NVML,
// also on a CPU rank: a GPU whose energy counter advances by JOULES at every reading (the engine
// reads it once at setup and once per step, so JOULES is its energy per step, whatever the step's
// time on a busy machine), using MEMORY_MIB of memory at UTILIZATION (0..1).
// tests/python/test_distributed.py runs one per rank, each with its own figures, and checks that the
// job's energy, J/token and memory count every rank's GPU. Prints one JSON line per reported step
// (every StepMetrics field) and the result.
//   ftd-fake-gpu-rank SPEC RANK STORE JOULES [MEMORY_MIB [UTILIZATION]]
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "nlohmann/json.hpp"
#include "spec/spec.h"
#include "worker/engine/engine.h"

namespace {

class FakeGpu : public ftd::engine::GpuMonitor {
 public:
  FakeGpu(double joules, uint64_t memory_bytes, double utilization)
      : joules_(joules), memory_bytes_(memory_bytes), utilization_(utilization) {}
  bool available() const override { return true; }
  Sample Read() override {
    Sample s;
    s.ok = true;
    s.energy_j = 5000.0 + joules_ * static_cast<double>(++reads_);  // a counter since the "driver loaded"
    s.power_w = joules_;
    s.utilization = utilization_;
    s.memory_used_bytes = memory_bytes_;
    return s;
  }

 private:
  const double joules_;
  const uint64_t memory_bytes_;
  const double utilization_;
  int64_t reads_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::cerr << "usage: ftd-fake-gpu-rank SPEC RANK STORE JOULES [MEMORY_MIB [UTILIZATION]]\n";
    return 64;
  }
  std::ifstream in(argv[1]);
  std::stringstream ss;
  ss << in.rdbuf();
  auto spec = ftd::spec::ParseTrainSpecJson(ss.str());
  if (!spec.ok()) {
    std::cerr << spec.status() << "\n";
    return 2;
  }
  auto config = ftd::spec::Validate(*spec, ftd::engine::LocalEnvironment());
  if (!config.ok()) {
    std::cerr << config.status() << "\n";
    return 2;
  }
  ftd::engine::RankInfo rank;
  rank.rank = std::stoi(argv[2]);
  rank.store_path = argv[3];
  rank.timeout_s = 60;
  const double joules = std::stod(argv[4]);
  const uint64_t memory_bytes = (argc > 5 ? std::stoull(argv[5]) : 1024) << 20;
  const double utilization = argc > 6 ? std::stod(argv[6]) : 0.5;

  ftd::engine::RunHooks hooks;
  hooks.open_gpu_monitor = [&] { return std::make_unique<FakeGpu>(joules, memory_bytes, utilization); };
  hooks.on_step = [](const ftd::engine::StepMetrics& m) {
    nlohmann::json j = {{"event", "step"}};
#define FTD_STEP_METRICS_JSON(type, name, meaning)          \
  if (const auto v = ftd::engine::MetricValue(m.name)) {     \
    j[#name] = *v;                                           \
  } else {                                                   \
    j[#name] = nullptr;                                      \
  }
    FTD_STEP_METRICS(FTD_STEP_METRICS_JSON)
#undef FTD_STEP_METRICS_JSON
    std::cout << j.dump() << std::endl;
  };
  hooks.on_log = [](std::string_view line) { std::cerr << line << std::endl; };
  const auto sum = ftd::engine::RunTraining(*config, hooks, rank);
  std::cout << nlohmann::json{{"event", "result"}, {"outcome", std::string(ftd::engine::OutcomeName(sum.outcome))},
                              {"message", sum.message}}
                   .dump()
            << std::endl;
  return sum.outcome == ftd::engine::Outcome::kSucceeded ? 0 : 1;
}

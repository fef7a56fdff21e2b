// GPU power, energy, utilisation and memory from NVML, loaded at run time (dlopen of
// libnvidia-ml.so.1): a machine without it, or a CPU run, reports "unavailable" and nothing fails.
// NVML's energy counter advances only every 20-100 ms, so per-step figures are taken over a window of
// whole steps lasting at least `min_window_s` (EnergyWindow), never over a single short step.
// No LibTorch, no CUDA headers.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace ftd::engine {

// NVML's view of one GPU. A test driver may stand in a monitor of its own (a subclass; RunHooks::
// open_gpu_monitor), also for a CPU rank.
class GpuMonitor {
 public:
  struct Sample {
    bool ok = false;
    double energy_j = 0;      // the device's energy counter (since the driver loaded)
    double power_w = 0;       // instantaneous board power
    double utilization = 0;   // 0..1 (NVML's sampled GPU utilisation)
    uint64_t memory_used_bytes = 0;
  };

  // Opens the device with this PCI bus id ("0000:19:00.0", as CUDA reports it). Never null: check
  // available(); reason() says why not. `library` overrides the NVML library name (tests).
  static std::unique_ptr<GpuMonitor> Open(const std::string& pci_bus_id,
                                          const std::string& library = "libnvidia-ml.so.1");
  static std::unique_ptr<GpuMonitor> Unavailable(const std::string& reason);
  virtual ~GpuMonitor();

  virtual bool available() const { return device_ != nullptr; }
  const std::string& reason() const { return reason_; }
  virtual Sample Read();

 protected:
  GpuMonitor();  // defined where Api is complete

 private:
  struct Api;
  void* lib_ = nullptr;
  void* device_ = nullptr;
  std::unique_ptr<Api> api_;
  std::string reason_;
  bool have_energy_counter_ = true;
  double integrated_j_ = 0;  // fallback when the device has no energy counter: power x time
  double last_t_ = -1;
};

// The GPUs of a data-parallel job as one, from each rank's sample of its own GPU: energy, power and
// memory in use summed, utilisation averaged; ok only when every GPU was read (a sum missing one
// would understate the job). One sample: itself.
GpuMonitor::Sample CombineGpuSamples(const std::vector<GpuMonitor::Sample>& per_gpu);

// Per-step energy over a window of whole steps: each step end adds (time, energy counter, tokens);
// Stats() covers the most recent steps spanning at least min_window_s (or all of them).
class EnergyWindow {
 public:
  explicit EnergyWindow(double min_window_s = 1.0) : min_window_s_(min_window_s) {}
  // The run's first reading, before its first step (tokens and steps done so far, e.g. on resume).
  void Start(double t_s, double energy_j, int64_t tokens_total, int64_t step);
  void AddStep(double t_s, double energy_j, int64_t tokens_total, int64_t step);
  struct Stats {
    double energy_total_j = 0;   // since Start
    double step_energy_j = 0;    // mean over the window's steps
    double joules_per_token = 0;
    double power_w = 0;          // mean over the window
  };
  Stats Current() const;

 private:
  struct Point {
    double t_s, energy_j;
    int64_t tokens_total, step;
  };
  double min_window_s_;
  Point start_{0, 0, 0, 0};
  std::deque<Point> points_;
};

}  // namespace ftd::engine

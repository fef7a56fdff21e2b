#include "worker/engine/core/gpu_monitor.h"

#include <dlfcn.h>

#include <chrono>

#include "absl/strings/str_cat.h"

namespace ftd::engine {
namespace {

// The few NVML declarations used (nvml.h's, restated so the build needs no NVML headers).
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
struct nvmlUtilization_t {
  unsigned int gpu, memory;
};
struct nvmlMemory_t {
  unsigned long long total, free, used;
};

double NowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

struct GpuMonitor::Api {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*by_pci)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*energy)(nvmlDevice_t, unsigned long long*) = nullptr;  // mJ
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*) = nullptr;         // mW
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
};

GpuMonitor::GpuMonitor() = default;

std::unique_ptr<GpuMonitor> GpuMonitor::Unavailable(const std::string& reason) {
  std::unique_ptr<GpuMonitor> m(new GpuMonitor());
  m->reason_ = reason;
  return m;
}

std::unique_ptr<GpuMonitor> GpuMonitor::Open(const std::string& pci_bus_id, const std::string& library) {
  std::unique_ptr<GpuMonitor> m(new GpuMonitor());
  m->lib_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (m->lib_ == nullptr) {
    m->reason_ = absl::StrCat("NVML not loaded (", dlerror(), ")");
    return m;
  }
  m->api_ = std::make_unique<Api>();
  Api& a = *m->api_;
  auto sym = [&](const char* name) { return dlsym(m->lib_, name); };
  a.init = reinterpret_cast<decltype(a.init)>(sym("nvmlInit_v2"));
  a.shutdown = reinterpret_cast<decltype(a.shutdown)>(sym("nvmlShutdown"));
  a.error_string = reinterpret_cast<decltype(a.error_string)>(sym("nvmlErrorString"));
  a.by_pci = reinterpret_cast<decltype(a.by_pci)>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
  a.energy = reinterpret_cast<decltype(a.energy)>(sym("nvmlDeviceGetTotalEnergyConsumption"));
  a.power = reinterpret_cast<decltype(a.power)>(sym("nvmlDeviceGetPowerUsage"));
  a.utilization = reinterpret_cast<decltype(a.utilization)>(sym("nvmlDeviceGetUtilizationRates"));
  a.memory = reinterpret_cast<decltype(a.memory)>(sym("nvmlDeviceGetMemoryInfo"));
  if (a.init == nullptr || a.shutdown == nullptr || a.by_pci == nullptr || a.power == nullptr) {
    m->reason_ = absl::StrCat(library, " lacks the NVML functions ftd needs");
    return m;
  }
  auto err = [&](nvmlReturn_t r) { return a.error_string != nullptr ? std::string(a.error_string(r)) : absl::StrCat(r); };
  if (nvmlReturn_t r = a.init(); r != kNvmlSuccess) {
    m->reason_ = absl::StrCat("nvmlInit failed: ", err(r));
    a.init = nullptr;  // nothing to shut down
    return m;
  }
  nvmlDevice_t dev = nullptr;
  if (nvmlReturn_t r = a.by_pci(pci_bus_id.c_str(), &dev); r != kNvmlSuccess) {
    m->reason_ = absl::StrCat("NVML has no device at PCI bus id ", pci_bus_id, ": ", err(r));
    return m;
  }
  m->device_ = dev;
  unsigned long long mj = 0;
  m->have_energy_counter_ = a.energy != nullptr && a.energy(dev, &mj) == kNvmlSuccess;
  return m;
}

GpuMonitor::~GpuMonitor() {
  if (api_ && api_->init != nullptr && api_->shutdown != nullptr) api_->shutdown();
  if (lib_ != nullptr) dlclose(lib_);
}

GpuMonitor::Sample GpuMonitor::Read() {
  Sample s;
  if (!available()) return s;
  const Api& a = *api_;
  unsigned int mw = 0;
  if (a.power(device_, &mw) == kNvmlSuccess) s.power_w = mw / 1000.0;
  const double t = NowS();
  if (have_energy_counter_) {
    unsigned long long mj = 0;
    if (a.energy(device_, &mj) != kNvmlSuccess) return s;
    s.energy_j = static_cast<double>(mj) / 1000.0;
  } else {  // older GPUs: integrate the power samples
    if (last_t_ >= 0) integrated_j_ += s.power_w * (t - last_t_);
    s.energy_j = integrated_j_;
  }
  last_t_ = t;
  nvmlUtilization_t u{};
  if (a.utilization != nullptr && a.utilization(device_, &u) == kNvmlSuccess) s.utilization = u.gpu / 100.0;
  nvmlMemory_t mem{};
  if (a.memory != nullptr && a.memory(device_, &mem) == kNvmlSuccess) s.memory_used_bytes = mem.used;
  s.ok = true;
  return s;
}

GpuMonitor::Sample CombineGpuSamples(const std::vector<GpuMonitor::Sample>& per_gpu) {
  GpuMonitor::Sample job;
  if (per_gpu.empty()) return job;
  job.ok = true;
  for (const auto& s : per_gpu) {
    job.ok = job.ok && s.ok;
    job.energy_j += s.energy_j;
    job.power_w += s.power_w;
    job.utilization += s.utilization / static_cast<double>(per_gpu.size());
    job.memory_used_bytes += s.memory_used_bytes;
  }
  if (!job.ok) return GpuMonitor::Sample{};
  return job;
}

void EnergyWindow::Start(double t_s, double energy_j, int64_t tokens_total, int64_t step) {
  start_ = {t_s, energy_j, tokens_total, step};
  points_.clear();
}

void EnergyWindow::AddStep(double t_s, double energy_j, int64_t tokens_total, int64_t step) {
  points_.push_back({t_s, energy_j, tokens_total, step});
  // Keep the newest points that still span the window (plus the one before it, the window's start).
  while (points_.size() > 2 && points_.back().t_s - points_[1].t_s >= min_window_s_) points_.pop_front();
}

EnergyWindow::Stats EnergyWindow::Current() const {
  Stats st;
  if (points_.empty()) return st;
  const Point& end = points_.back();
  st.energy_total_j = end.energy_j - start_.energy_j;
  // The window starts at the oldest kept point, or at Start when the run is shorter than the window.
  const Point& begin = (points_.size() >= 2 && end.t_s - points_.front().t_s >= min_window_s_) ? points_.front() : start_;
  const double de = end.energy_j - begin.energy_j, dt = end.t_s - begin.t_s;
  const int64_t steps = end.step - begin.step, tokens = end.tokens_total - begin.tokens_total;
  if (steps > 0) st.step_energy_j = de / static_cast<double>(steps);
  if (tokens > 0) st.joules_per_token = de / static_cast<double>(tokens);
  if (dt > 0) st.power_w = de / dt;
  return st;
}

}  // namespace ftd::engine

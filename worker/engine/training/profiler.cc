#include "worker/engine/training/profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ftd::engine {
namespace {

namespace tp = torch::profiler::impl;
using torch::autograd::profiler::KinetoEvent;

// libkineto's activity types (its ActivityType.h is not shipped with the torch wheel).
constexpr uint8_t kCpuOp = 0, kUserAnnotation = 1, kGpuMemcpy = 3, kGpuMemset = 4, kKernel = 5;
constexpr uint8_t kBackwardFunctionScope = static_cast<uint8_t>(at::RecordScope::BACKWARD_FUNCTION);

struct Node {
  const KinetoEvent* e;
  int parent = -1;
  double self_host_ns = 0;
  double device_ns = 0;
};

std::string Suffix(const std::string& name, const char* prefix) { return name.substr(std::strlen(prefix)); }

// ftd::<family>_forward / ftd::<family>_backward (our kernels) -> category.
std::string CategoryOfFamily(const std::string& family) {
  if (family == "rmsnorm" || family == "rope" || family == "swiglu" || family == "cross_entropy") return family;
  if (family == "linear_cross_entropy") return "cross_entropy";
  if (family == "adamw") return "optimizer";
  return "other";
}

}  // namespace

std::string CategoryOfOpName(const std::string& n) {
  if (absl::StrContains(n, "attention") || absl::StrContains(n, "flash") || absl::StrContains(n, "sdpa") ||
      absl::StrContains(n, "fmha")) {
    return "attention";
  }
  for (const char* mm : {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::_scaled_mm",
                         "aten::baddbmm", "aten::addmv", "aten::mv"}) {
    if (n == mm) return "matmul";
  }
  if (absl::StartsWith(n, "ftd::") && !absl::StartsWith(n, "ftd::op::") && !absl::StartsWith(n, "ftd::phase::")) {
    std::string family = n.substr(5);
    for (const char* s : {"_forward", "_backward", "_step", "_grad_norm"}) {
      if (absl::EndsWith(family, s)) family = family.substr(0, family.size() - std::strlen(s));
    }
    return CategoryOfFamily(family);
  }
  if (absl::StrContains(n, "_fused_adamw") || absl::StrContains(n, "_foreach_")) return "optimizer";
  return "other";
}

void StepProfiler::Start() {
  tp::ProfilerConfig cfg(tp::ProfilerState::KINETO, /*report_input_shapes=*/false, /*profile_memory=*/false,
                         /*with_stack=*/false, /*with_flops=*/false, /*with_modules=*/false);
  std::set<tp::ActivityType> acts{tp::ActivityType::CPU};
  if (cuda_) acts.insert(tp::ActivityType::CUDA);
  torch::autograd::profiler::prepareProfiler(cfg, acts);
  torch::autograd::profiler::enableProfiler(cfg, acts);
}

ProfileSummary StepProfiler::Stop(int steps, double wall_ms_per_step, const std::string& trace_path) {
  if (cuda_) torch::cuda::synchronize();
  auto result = torch::autograd::profiler::disableProfiler();
  ProfileSummary sum;
  sum.device = cuda_ ? "cuda" : "cpu";
  sum.steps = steps;
  sum.step_wall_ms = wall_ms_per_step;
  const auto& events = result->events();

  // Host events, nested per thread by time: the parent of an event is the innermost one enclosing it.
  std::vector<Node> nodes;
  std::vector<const KinetoEvent*> device;
  for (const auto& e : events) {
    if (e.deviceType() == c10::DeviceType::CPU && (e.activityType() == kCpuOp || e.activityType() == kUserAnnotation)) {
      nodes.push_back({&e});
    } else if (e.deviceType() != c10::DeviceType::CPU &&
               (e.activityType() == kKernel || e.activityType() == kGpuMemcpy || e.activityType() == kGpuMemset)) {
      device.push_back(&e);
    }
  }
  std::sort(nodes.begin(), nodes.end(), [](const Node& a, const Node& b) {
    if (a.e->startThreadId() != b.e->startThreadId()) return a.e->startThreadId() < b.e->startThreadId();
    if (a.e->startNs() != b.e->startNs()) return a.e->startNs() < b.e->startNs();
    return a.e->endNs() > b.e->endNs();
  });
  std::vector<int> stack;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    const auto* e = nodes[i].e;
    while (!stack.empty() && (nodes[stack.back()].e->startThreadId() != e->startThreadId() ||
                              nodes[stack.back()].e->endNs() <= e->startNs())) {
      stack.pop_back();
    }
    nodes[i].parent = stack.empty() ? -1 : stack.back();
    nodes[i].self_host_ns += static_cast<double>(e->durationNs());
    if (nodes[i].parent >= 0) nodes[nodes[i].parent].self_host_ns -= static_cast<double>(e->durationNs());
    stack.push_back(i);
  }
  // Device time goes to the op that launched it (its correlation id).
  std::unordered_map<uint64_t, int> by_corr;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) by_corr[nodes[i].e->correlationId()] = i;
  double device_total_ns = 0;
  std::map<std::string, std::pair<double, int>> unattributed;  // kernel name -> (ns, launches)
  for (const auto* d : device) {
    device_total_ns += static_cast<double>(d->durationNs());
    auto it = by_corr.find(d->linkedCorrelationId());
    if (it != by_corr.end()) {
      nodes[it->second].device_ns += static_cast<double>(d->durationNs());
    } else {
      auto& u = unattributed[d->name()];
      u.first += static_cast<double>(d->durationNs());
      u.second += 1;
    }
  }
  // Phase windows (host time), for ops on other threads (autograd's device threads).
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> windows;
  for (const auto& n : nodes) {
    if (absl::StartsWith(n.e->name(), "ftd::phase::")) {
      windows.emplace_back(n.e->startNs(), n.e->endNs(), Suffix(n.e->name(), "ftd::phase::"));
    }
  }
  auto phase_of = [&](int i) -> std::string {
    for (int a = i; a >= 0; a = nodes[a].parent) {
      if (absl::StartsWith(nodes[a].e->name(), "ftd::phase::")) return Suffix(nodes[a].e->name(), "ftd::phase::");
    }
    const uint64_t t = nodes[i].e->startNs();
    for (const auto& [s, e, p] : windows) {
      if (t >= s && t < e) return p;
    }
    return "other";
  };
  // Categories: an enclosing ftd::op:: scope (forward), else the forward op's scope through the
  // autograd sequence number (backward), else the op's name.
  auto scope_category = [&](int i) -> std::string {
    for (int a = i; a >= 0; a = nodes[a].parent) {
      if (absl::StartsWith(nodes[a].e->name(), "ftd::op::")) return Suffix(nodes[a].e->name(), "ftd::op::");
    }
    return "";
  };
  std::map<std::pair<uint64_t, int64_t>, std::string> forward_category;  // (thread, sequence nr) -> category
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    const auto* e = nodes[i].e;
    if (e->sequenceNr() >= 0 && e->scope() != kBackwardFunctionScope) {
      const std::string c = scope_category(i);
      if (!c.empty()) forward_category.emplace(std::make_pair(e->startThreadId(), e->sequenceNr()), c);
    }
  }
  auto category_of = [&](int i, const std::string& phase) -> std::string {
    const std::string own = CategoryOfOpName(nodes[i].e->name());
    if (own != "other") return own;
    if (std::string c = scope_category(i); !c.empty()) return c;
    for (int a = i; a >= 0; a = nodes[a].parent) {
      const auto* e = nodes[a].e;
      if (e->scope() == kBackwardFunctionScope) {
        auto it = forward_category.find({e->fwdThreadId(), e->sequenceNr()});
        if (it != forward_category.end()) return it->second;
        break;
      }
    }
    return phase == "optimizer" ? "optimizer" : "other";
  };

  // Aggregate by (phase, name, category): aten::mul in the backward is a row for each family it
  // serves. Our pure scopes are not rows.
  std::map<std::tuple<std::string, std::string, std::string>, OpStat> rows;
  double host_total_ns = 0;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    const std::string name = nodes[i].e->name();
    if (absl::StartsWith(name, "ftd::phase::") || absl::StartsWith(name, "ftd::op::")) continue;
    const std::string phase = phase_of(i);
    const std::string category = category_of(i, phase);
    OpStat& r = rows[{phase, name, category}];
    r.name = name;
    r.phase = phase;
    r.category = category;
    r.calls += 1;
    r.host_ms += nodes[i].self_host_ns / 1e6;
    r.device_ms += nodes[i].device_ns / 1e6;
    host_total_ns += nodes[i].self_host_ns;
  }
  // Device work no op claims (launched outside any recorded op) keeps its kernel name.
  for (const auto& [name, u] : unattributed) {
    OpStat& r = rows[{"other", name, CategoryOfOpName(name)}];
    r.name = name;
    r.phase = "other";
    r.category = CategoryOfOpName(name);
    r.device_ms += u.first / 1e6;
    r.calls += u.second;
  }
  // On a CPU run the "device" is the CPU: self CPU time is the op's time.
  const bool cpu = !cuda_;
  const double total_ms = (cpu ? host_total_ns : device_total_ns) / 1e6;
  std::map<std::string, double> cats;
  for (auto& [key, r] : rows) {
    if (cpu) r.device_ms = r.host_ms;
    r.device_ms /= steps;
    r.host_ms /= steps;
    r.calls /= steps;
    r.share = total_ms > 0 ? r.device_ms * steps / total_ms : 0;
    cats[r.category] += r.device_ms;
    sum.ops.push_back(r);
  }
  std::sort(sum.ops.begin(), sum.ops.end(), [](const OpStat& a, const OpStat& b) {
    return a.device_ms != b.device_ms ? a.device_ms > b.device_ms : a.host_ms > b.host_ms;
  });
  sum.step_device_ms = total_ms / steps;
  for (const char* c : {"attention", "matmul", "rmsnorm", "swiglu", "rope", "cross_entropy", "optimizer", "other"}) {
    sum.category_ms.emplace_back(c, cats[c]);
  }
  if (!trace_path.empty()) {
    result->save(trace_path);
    sum.trace_path = trace_path;
    std::error_code ec;
    sum.trace_bytes = std::filesystem::file_size(trace_path, ec);
    if (ec) sum.trace_bytes = 0;
  }
  return sum;
}

}  // namespace ftd::engine

#include "server/policy/memory_fit.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spec/bytes.h"
#include "spec/peak_memory.h"

namespace ftd::server {
namespace fs = std::filesystem;

namespace {

std::string Bytes(double b) { return spec::FormatBytes(b); }

// The largest v in [1, hi] with fits(v), or 0 when even 1 does not fit (fits is monotone).
int32_t LargestFitting(int32_t hi, const std::function<bool(int32_t)>& fits) {
  if (!fits(1)) return 0;
  int32_t lo = 1;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace

int64_t HostMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

std::optional<spec::LlamaConfig> ModelShape(const spec::TrainConfig& c, bool gpu) {
  const std::string& path = !c.model.config_path.empty() ? c.model.config_path : c.model.weights_path;
  if (!c.model.preset.empty() || path.empty()) {
    auto m = spec::PresetLlamaConfig(!c.model.preset.empty() ? c.model.preset : gpu ? "llama-3.1-8b" : "tiny");
    return m.ok() ? std::optional(*m) : std::nullopt;
  }
  std::error_code ec;
  const fs::path file = fs::is_directory(path, ec) ? fs::path(path) / "config.json" : fs::path(path);
  // A FIFO would block the daemon's read; a config.json is a few kB.
  if (!fs::is_regular_file(file, ec) || fs::file_size(file, ec) > (1 << 20) || ec) return std::nullopt;
  auto m = spec::LoadLlamaConfig(file.string());
  return m.ok() ? std::optional(*m) : std::nullopt;
}

absl::Status CheckMemoryFit(const spec::LlamaConfig& model, const spec::TrainConfig& c, bool gpu,
                            const MachineMemory& m) {
  const double capacity = static_cast<double>(gpu ? m.gpu_bytes : m.host_bytes);
  if (capacity <= 0) return absl::OkStatus();
  const spec::PeakMemory peak = spec::PredictPeakMemory(model, c, gpu);
  if (peak.Peak() <= capacity) return absl::OkStatus();
  const auto fits = [&](int32_t batch, int32_t seq) {
    spec::TrainConfig t = c;
    t.batch_size = batch;
    t.seq_len = seq;
    return spec::PredictPeakMemory(model, t, gpu).Peak() <= capacity;
  };
  const std::string where = gpu ? absl::StrCat("a GPU here has ", Bytes(capacity))
                                : absl::StrCat("a worker here may use ", Bytes(capacity), " of host memory");
  const std::string needs = absl::StrCat("needs about ", Bytes(peak.Peak()), " (predicted ", peak.ToString(),
                                         ") but ", where);
  if (const int32_t b = LargestFitting(c.batch_size, [&](int32_t v) { return fits(v, c.seq_len); }); b > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.batch_size: the job (batch_size ", c.batch_size, ", seq_len ", c.seq_len, ") ", needs,
        "; lower spec.batch_size to at most ", b, " (raise spec.grad_accum_steps to keep the tokens per step)"));
  }
  if (const int32_t s = LargestFitting(c.seq_len, [&](int32_t v) { return fits(1, v); }); s > 0) {
    return absl::InvalidArgumentError(absl::StrCat("spec.seq_len: the job (batch_size ", c.batch_size, ", seq_len ",
                                                   c.seq_len, ") ", needs, "; even batch_size 1 needs spec.seq_len ",
                                                   "at most ", s));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "spec.model: the model (", model.NumParameters(), " parameters) ", needs, " before any activations; ",
      c.lora.enabled ? "choose a smaller model" : "fine-tune it with LoRA (spec.lora) or choose a smaller model",
      gpu ? "" : ", or run it on a GPU"));
}

}  // namespace ftd::server

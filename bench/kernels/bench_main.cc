// ftd-kernel-bench: measures the device-to-device copy bandwidth, then runs each kernel family's
// benchmark (ours vs the eager LibTorch ops, forward + backward, LLaMA-3.1-8B sizes), prints one
// markdown table per family and optionally writes every row as JSON.
//
//   ftd-kernel-bench [--tokens 256,1024,4096,16384] [--iters 20] [--warmup 3]
//                    [--families rmsnorm,swiglu,rope,adamw,cross_entropy,fused_linear_ce]
//                    [--dtype bf16|fp32] [--json FILE]
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/kernels/bench.h"

namespace ftd::bench {
// Defined in bench_util.cc (bytes read plus written per second by a device-to-device copy).
double MeasureCopyBytesPerSecond(const BenchConfig& cfg);
}  // namespace ftd::bench

namespace {

using ftd::bench::BenchConfig;
using ftd::bench::Row;

struct Family {
  const char* name;
  void (*run)(const BenchConfig&, std::vector<Row>&);
};

constexpr Family kFamilies[] = {
    {"rmsnorm", ftd::bench::BenchRmsNorm},
    {"swiglu", ftd::bench::BenchSwiGlu},
    {"rope", ftd::bench::BenchRope},
    {"adamw", ftd::bench::BenchAdamW},
    {"cross_entropy", ftd::bench::BenchCrossEntropy},
    {"fused_linear_ce", ftd::bench::BenchFusedLinearCrossEntropy},
    {"fp8_cast", ftd::bench::BenchFp8Cast},
    {"fp8_tiles", ftd::bench::BenchFp8Tiles},
};

constexpr const char* kUsage =
    "usage: ftd-kernel-bench [--tokens N,N,...] [--iters N] [--warmup N] [--families a,b,...]\n"
    "                        [--dtype bf16|fp32] [--json FILE]\n"
    "families: rmsnorm, swiglu, rope, adamw, cross_entropy, fused_linear_ce, fp8_cast, fp8_tiles (default: all)\n";

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Parses a whole decimal integer >= min_value; false otherwise.
bool ParseInt(const std::string& s, int64_t min_value, int64_t& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (*end != '\0' || v < min_value) return false;
  out = v;
  return true;
}

struct Options {
  BenchConfig cfg;
  std::vector<std::string> families;
  std::string json;
};

// Accepts "--flag value" and "--flag=value". Returns false (after printing why) on a bad command line.
bool ParseArgs(int argc, char** argv, Options& o) {
  for (const auto& f : kFamilies) o.families.emplace_back(f.name);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      std::cerr << arg << " needs a value\n" << kUsage;
      return false;
    }
    int64_t n = 0;
    if (arg == "--tokens") {
      o.cfg.tokens.clear();
      for (const auto& t : SplitCommas(value)) {
        if (!ParseInt(t, 1, n)) {
          std::cerr << "--tokens must be a comma-separated list of integers >= 1 (got '" << value << "')\n";
          return false;
        }
        o.cfg.tokens.push_back(n);
      }
      if (o.cfg.tokens.empty()) {
        std::cerr << "--tokens must name at least one size\n";
        return false;
      }
    } else if (arg == "--iters" || arg == "--warmup") {
      if (!ParseInt(value, arg == "--iters" ? 1 : 0, n) || n > 100000) {
        std::cerr << arg << " must be an integer in [" << (arg == "--iters" ? 1 : 0) << ", 100000] (got '" << value
                  << "')\n";
        return false;
      }
      (arg == "--iters" ? o.cfg.iters : o.cfg.warmup) = static_cast<int>(n);
    } else if (arg == "--families") {
      o.families = SplitCommas(value);
      for (const auto& name : o.families) {
        bool known = false;
        for (const auto& f : kFamilies) known = known || name == f.name;
        if (!known) {
          std::cerr << "--families: unknown family '" << name << "'\n" << kUsage;
          return false;
        }
      }
    } else if (arg == "--dtype") {
      if (value != "bf16" && value != "fp32") {
        std::cerr << "--dtype must be bf16 or fp32 (got '" << value << "')\n";
        return false;
      }
      o.cfg.dtype = value == "bf16" ? torch::kBFloat16 : torch::kFloat;
    } else if (arg == "--json") {
      o.json = value;
    } else {
      std::cerr << "unknown flag " << arg << "\n" << kUsage;
      return false;
    }
  }
  return true;
}

std::string Fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

double Speedup(const Row& r) { return r.ours_us > 0 && r.eager_us > 0 ? r.eager_us / r.ours_us : 0; }
double OursBytesPerSecond(const Row& r) { return r.ours_us > 0 ? r.bytes / (r.ours_us * 1e-6) : 0; }
double Mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

void PrintTable(const std::string& family, const std::vector<Row>& rows, double copy_bytes_per_s) {
  std::cout << "\n### " << family << "\n\n"
            << "| tokens | ours µs | eager µs | speedup | ours GB/s | % of copy bandwidth | ours peak MiB | "
               "eager peak MiB | variant | note |\n"
            << "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n";
  for (const Row& r : rows) {
    const double bps = OursBytesPerSecond(r);
    std::cout << "| " << r.tokens << " | " << Fmt("%.1f", r.ours_us) << " | "
              << (r.eager_us > 0 ? Fmt("%.1f", r.eager_us) : "-") << " | "
              << (Speedup(r) > 0 ? Fmt("%.2fx", Speedup(r)) : "-") << " | " << Fmt("%.0f", bps / 1e9) << " | "
              << (copy_bytes_per_s > 0 ? Fmt("%.1f%%", 100 * bps / copy_bytes_per_s) : "-") << " | "
              << Fmt("%.1f", Mib(r.ours_peak_bytes)) << " | " << Fmt("%.1f", Mib(r.eager_peak_bytes)) << " | "
              << r.variant << " | " << r.note << " |\n";
  }
  std::cout.flush();
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string JsonNumber(double v) { return std::isfinite(v) ? Fmt("%.6g", v) : "null"; }

bool WriteJson(const std::string& path, const std::string& device, const Options& o, const std::vector<Row>& rows,
               const std::vector<std::string>& errors) {
  std::ofstream out(path);
  if (!out) return false;
  const BenchConfig& c = o.cfg;
  out << "{\n  \"device\": " << JsonString(device) << ",\n  \"copy_bytes_per_s\": " << JsonNumber(c.copy_bytes_per_s)
      << ",\n  \"dtype\": " << JsonString(c10::toString(c.dtype)) << ",\n  \"hidden\": " << c.hidden
      << ",\n  \"intermediate\": " << c.intermediate << ",\n  \"vocab\": " << c.vocab << ",\n  \"warmup\": " << c.warmup
      << ",\n  \"iters\": " << c.iters << ",\n  \"rows\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double bps = OursBytesPerSecond(r);
    out << (i ? ",\n" : "\n") << "    {\"family\": " << JsonString(r.family) << ", \"variant\": " << JsonString(r.variant)
        << ", \"tokens\": " << r.tokens << ", \"ours_us\": " << JsonNumber(r.ours_us)
        << ", \"eager_us\": " << JsonNumber(r.eager_us) << ", \"speedup\": " << JsonNumber(Speedup(r))
        << ", \"bytes\": " << JsonNumber(r.bytes) << ", \"ours_bytes_per_s\": " << JsonNumber(bps)
        << ", \"copy_fraction\": " << JsonNumber(c.copy_bytes_per_s > 0 ? bps / c.copy_bytes_per_s : 0)
        << ", \"ours_peak_bytes\": " << r.ours_peak_bytes << ", \"eager_peak_bytes\": " << r.eager_peak_bytes
        << ", \"note\": " << JsonString(r.note) << "}";
  }
  out << "\n  ],\n  \"errors\": [";
  for (size_t i = 0; i < errors.size(); ++i) out << (i ? ", " : "") << JsonString(errors[i]);
  out << "]\n}\n";
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!ParseArgs(argc, argv, o)) return 2;
  if (!torch::cuda::is_available()) {
    std::cerr << "ftd-kernel-bench: no CUDA device\n";
    return 2;
  }
  torch::manual_seed(0);
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  const std::string device = prop->name;

  std::vector<Row> all;
  std::vector<std::string> errors;
  try {
    o.cfg.copy_bytes_per_s = ftd::bench::MeasureCopyBytesPerSecond(o.cfg);
  } catch (const std::exception& e) {
    std::cerr << "copy bandwidth: " << e.what() << "\n";
    return 1;
  }
  std::cout << "# ftd-kernel-bench on " << device << " (" << prop->multiProcessorCount << " SMs), "
            << c10::toString(o.cfg.dtype) << ", median of " << o.cfg.iters << " after " << o.cfg.warmup
            << " warm-up\n\ndevice-to-device copy: " << Fmt("%.0f", o.cfg.copy_bytes_per_s / 1e9)
            << " GB/s (bytes read + written)\n";

  for (const auto& f : kFamilies) {
    bool selected = false;
    for (const auto& name : o.families) selected = selected || name == f.name;
    if (!selected) continue;
    std::vector<Row> rows;
    try {
      f.run(o.cfg, rows);
    } catch (const std::exception& e) {
      // One family failing (e.g. out of memory at the largest size) does not stop the others.
      errors.push_back(std::string(f.name) + ": " + e.what());
      std::cerr << "\n" << f.name << " failed: " << e.what() << "\n";
    }
    PrintTable(f.name, rows, o.cfg.copy_bytes_per_s);
    all.insert(all.end(), rows.begin(), rows.end());
    c10::cuda::CUDACachingAllocator::emptyCache();
  }

  if (!o.json.empty() && !WriteJson(o.json, device, o, all, errors)) {
    std::cerr << "cannot write " << o.json << "\n";
    return 1;
  }
  return errors.empty() ? 0 : 1;
}

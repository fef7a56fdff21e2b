// ftd-parity: a test driver that runs our LibTorch LLaMA on one batch and writes what the HF
// parity tests compare: logits, the mean loss and every parameter's gradient.
//   ftd-parity MODEL_DIR BATCH.safetensors OUT.safetensors [DEVICE [DTYPE [KERNEL_SET [ADAPTER_DIR]]]]
// MODEL_DIR holds config.json + HF safetensors; BATCH holds input_ids and labels ([B, T] I64,
// labels already shifted, -100 ignored). Runs on DEVICE (default cpu) in DTYPE (fp32 or bf16,
// default fp32) with KERNEL_SET (eager or fused, default eager); outputs are written in fp32.
// BATCH may instead be a JSON file {"data": {...spec.data...}, "seq_len": T, "batch_size": B}: the
// batch is then the data loader's first micro-batch, and OUT also holds its input_ids, labels,
// positions and segments.
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/match.h"
#include "nlohmann/json.hpp"
#include "worker/engine/core/token_data.h"

#include "worker/engine/model/model.h"
#include "worker/engine/core/safetensors.h"
#include "worker/engine/torch_util.h"

using namespace ftd::engine;

namespace {

absl::StatusOr<torch::Tensor> Read(const SafetensorsFile& f, const char* name) {
  const TensorInfo* t = f.Find(name);
  if (t == nullptr) return absl::NotFoundError(std::string("batch file lacks ") + name);
  auto dt = TorchDType(t->dtype);
  if (!dt.ok()) return dt.status();
  return torch::from_blob(const_cast<std::byte*>(f.data(*t)), t->shape, torch::TensorOptions().dtype(*dt)).clone();
}

// The data loader's first micro-batch for {"data": {...}, "seq_len": T, "batch_size": B}.
absl::StatusOr<MicroBatch> LoaderBatch(const std::string& path, int64_t vocab_size) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const auto j = nlohmann::json::parse(ss.str());
  const auto& d = j.at("data");
  DataConfig dc;
  dc.path = d.value("path", "");
  dc.format = d.value("format", dc.format);
  dc.sequence = d.value("sequence", dc.sequence);
  dc.tokenizer_path = d.value("tokenizer_path", "");
  dc.cache_dir = d.value("cache_dir", "");
  auto data = TokenData::Open(dc, j.at("seq_len").get<int64_t>(), j.at("batch_size").get<int64_t>(), vocab_size);
  if (!data.ok()) return data.status();
  MicroBatch b;
  (*data)->Batch(0, &b);
  return b;
}

absl::Status Main(const std::string& model_dir, const std::string& batch_path, const std::string& out_path,
                  const std::string& device_name, const std::string& dtype_name, const std::string& kernel_set,
                  const std::string& adapter_dir) {
  auto cfg = ReadLlamaConfig(model_dir, "MODEL_DIR");
  if (!cfg.ok()) return cfg.status();
  const torch::Device device(device_name);
  const auto dtype = dtype_name == "bf16" ? torch::kBFloat16 : torch::kFloat;
  TrainConfig tc;
  const auto ks = ftd::spec::ParseKernelSet(kernel_set);
  if (!ks) return absl::InvalidArgumentError("KERNEL_SET must be eager or fused");
  tc.kernel_set = *ks;
  tc.device = device_name;
  if (auto s = tc.Validate(); !s.ok()) return s;
  auto model = LlamaModel::Create(*cfg, device, dtype, 0);
  if (!model.ok()) return model.status();
  (*model)->SetKernels(tc.Kernels());
  if (auto s = (*model)->LoadWeights(model_dir); !s.ok()) return s;
  if (!adapter_dir.empty()) {
    auto lora = LoraConfigFromPeft(adapter_dir);
    if (!lora.ok()) return lora.status();
    lora->dtype = "fp32";
    if (auto s = (*model)->EnableLora(*lora, 0); !s.ok()) return s;
  }
  absl::StatusOr<torch::Tensor> ids, labels;
  PackedLayout layout;
  std::vector<std::pair<std::string, torch::Tensor>> out;
  if (absl::EndsWith(batch_path, ".json")) {
    auto b = LoaderBatch(batch_path, cfg->vocab_size);
    if (!b.ok()) return b.status();
    auto t = [&](std::vector<int64_t>& v) { return torch::from_blob(v.data(), {b->rows, b->seq}, torch::kInt64).clone(); };
    ids = t(b->input_ids);
    labels = t(b->labels);
    auto positions = t(b->positions), segments = t(b->segments);
    out = {{"input_ids", *ids}, {"labels", *labels}, {"positions", positions}, {"segments", segments}};
    if (b->multi_document) layout = PackedLayout::FromSegments(positions.to(device), segments.to(device));
  } else {
    auto batch = SafetensorsFile::Open(batch_path);
    if (!batch.ok()) return batch.status();
    ids = Read(**batch, "input_ids");
    if (!ids.ok()) return ids.status();
    labels = Read(**batch, "labels");
    if (!labels.ok()) return labels.status();
  }
  *ids = ids->to(device);
  *labels = labels->to(device);
  torch::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    logits = (*model)->Logits(*ids, layout);
  }
  auto count = labels->ne(kIgnoreIndex).sum().to(torch::kFloat).clamp_min(1.0);
  auto loss = (*model)->LossMean(*ids, *labels, count, layout);
  loss.backward();
  auto host = [](const torch::Tensor& t) { return t.detach().to(torch::kCPU, torch::kFloat).contiguous(); };
  out.emplace_back("logits", host(logits));
  out.emplace_back("loss", host(loss).reshape({1}));
  for (const auto& [name, p] : (*model)->trainable_parameters()) out.emplace_back("grad." + name, host(p.grad()));
  return WriteTensors(out_path, out, {}, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 8) {
    std::cerr << "usage: ftd-parity MODEL_DIR BATCH.safetensors OUT.safetensors [DEVICE [fp32|bf16 [eager|fused "
                 "[ADAPTER_DIR]]]]\n";
    return 2;
  }
  if (auto s = Main(argv[1], argv[2], argv[3], argc > 4 ? argv[4] : "cpu", argc > 5 ? argv[5] : "fp32",
                    argc > 6 ? argv[6] : "eager", argc > 7 ? argv[7] : "");
      !s.ok()) {
    std::cerr << "ftd-parity: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

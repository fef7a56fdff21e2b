#include "worker/engine/checkpoint.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "worker/engine/fs_util.h"
#include "worker/engine/torch_util.h"

namespace ftd::engine {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kFormat[] = "ftd-checkpoint-1";
const char* const kFiles[] = {"model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json"};
// LoRA: the adapters in PEFT's format instead of the model; the base stays where it was read from.
const char* const kLoraFiles[] = {"adapter_model.safetensors", "adapter_config.json", "optimizer.safetensors",
                                  "trainer_state.json"};
const char* const kMergedFiles[] = {"merged/model.safetensors", "merged/config.json"};

std::optional<int64_t> StepOf(const fs::path& p) {
  const std::string n = p.filename().string();
  if (n.size() != 13 || n.rfind("step-", 0) != 0) return std::nullopt;
  if (n.find_first_not_of("0123456789", 5) != std::string::npos) return std::nullopt;
  return std::stoll(n.substr(5));
}

bool Complete(const fs::path& dir) {
  auto text = ReadFile((dir / "MANIFEST.json").string());
  if (!text.ok()) return false;
  try {
    json m = json::parse(*text);
    if (m.value("format", "") != kFormat) return false;
    for (auto it = m["files"].begin(); it != m["files"].end(); ++it) {
      std::error_code ec;
      if (fs::file_size(dir / it.key(), ec) != it.value().get<uint64_t>() || ec) return false;
    }
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

}  // namespace

absl::StatusOr<std::string> SaveCheckpoint(const std::string& root, const TrainerState& st, const LlamaModel& model,
                                           const AdamW& opt, int keep_last, bool merged) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", root, ": ", ec.message()));
  const std::string name = absl::StrFormat("step-%08d", st.step);
  const fs::path final_dir = fs::path(root) / name;
  const fs::path tmp = fs::path(root) / (name + ".tmp");
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", tmp.string(), ": ", ec.message()));

  if (model.lora()) {
    if (auto s = model.SaveAdapters(tmp.string()); !s.ok()) return s;
    if (merged) {
      fs::create_directories(tmp / "merged", ec);
      if (ec) return absl::InternalError(absl::StrCat("create ", (tmp / "merged").string(), ": ", ec.message()));
      if (auto s = model.SaveMerged((tmp / "merged").string()); !s.ok()) return s;
      if (auto s = FsyncDir((tmp / "merged").string()); !s.ok()) return s;
    }
  } else {
    if (auto s = model.SaveWeights(tmp.string()); !s.ok()) return s;
  }

  // Optimizer state and RNG states.
  std::vector<std::pair<std::string, torch::Tensor>> tensors = opt.State();
  tensors.emplace_back("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
  std::vector<torch::Tensor> host;
  std::vector<TensorToWrite> out;
  host.reserve(tensors.size());
  for (const auto& [key, t] : tensors) {
    host.push_back(t.detach().to(torch::kCPU).contiguous());
    auto d = SafetensorsDType(host.back().scalar_type());
    if (!d.ok()) return d.status();
    out.push_back({key, *d, host.back().sizes().vec(), host.back().data_ptr()});
  }
  if (auto s = WriteSafetensors((tmp / "optimizer.safetensors").string(), out); !s.ok()) return s;

  json state = {{"step", st.step},           {"micro_batches", st.micro_batches}, {"tokens_total", st.tokens_total},
                {"batch_size", st.batch_size}, {"seq_len", st.seq_len},           {"shuffle", st.shuffle},
                {"data_seed", st.data_seed}, {"data_path", st.data_path}};
  if (auto s = WriteFileSynced((tmp / "trainer_state.json").string(), state.dump(2)); !s.ok()) return s;

  json manifest = {{"format", kFormat}, {"step", st.step}, {"files", json::object()}};
  for (const char* f : kFiles) {
    if (!model.lora()) manifest["files"][f] = fs::file_size(tmp / f);
  }
  for (const char* f : kLoraFiles) {
    if (model.lora()) manifest["files"][f] = fs::file_size(tmp / f);
  }
  for (const char* f : kMergedFiles) {
    if (model.lora() && merged) manifest["files"][f] = fs::file_size(tmp / f);
  }
  if (auto s = WriteFileSynced((tmp / "MANIFEST.json").string(), manifest.dump(2)); !s.ok()) return s;
  if (auto s = FsyncDir(tmp.string()); !s.ok()) return s;
  fs::remove_all(final_dir, ec);
  fs::rename(tmp, final_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("rename ", tmp.string(), ": ", ec.message()));
  if (auto s = FsyncDir(root); !s.ok()) return s;

  if (keep_last > 0) {
    std::vector<std::pair<int64_t, fs::path>> done;
    for (const auto& e : fs::directory_iterator(root, ec)) {
      if (auto step = StepOf(e.path()); step && Complete(e.path())) done.emplace_back(*step, e.path());
    }
    std::sort(done.begin(), done.end());
    for (size_t i = 0; i + static_cast<size_t>(keep_last) < done.size(); ++i) fs::remove_all(done[i].second, ec);
  }
  return final_dir.string();
}

absl::StatusOr<std::optional<std::string>> LatestCheckpoint(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::optional<std::string>();
  std::optional<std::pair<int64_t, fs::path>> best;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    auto step = StepOf(e.path());
    if (!step || !Complete(e.path())) continue;
    if (!best || *step > best->first) best = {*step, e.path()};
  }
  if (ec) return absl::InternalError(absl::StrCat("list ", root, ": ", ec.message()));
  if (!best) return std::optional<std::string>();
  return std::optional<std::string>(best->second.string());
}

absl::Status LoadCheckpoint(const std::string& dir, TrainerState* st, LlamaModel* model, AdamW* opt) {
  auto text = ReadFile((fs::path(dir) / "trainer_state.json").string());
  if (!text.ok()) return text.status();
  TrainerState saved;
  try {
    json j = json::parse(*text);
    saved.step = j.at("step");
    saved.micro_batches = j.at("micro_batches");
    saved.tokens_total = j.at("tokens_total");
    saved.batch_size = j.at("batch_size");
    saved.seq_len = j.at("seq_len");
    saved.shuffle = j.at("shuffle");
    saved.data_seed = j.at("data_seed");
    saved.data_path = j.at("data_path");
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat(dir, "/trainer_state.json: ", e.what()));
  }
  auto mismatch = [&](const char* field, auto a, auto b) {
    return absl::FailedPreconditionError(absl::StrCat("cannot resume from ", dir, ": spec.", field, " is ", b,
                                                      " but the checkpoint was written with ", a,
                                                      " (use the same value, or a new checkpoint.dir)"));
  };
  if (saved.batch_size != st->batch_size) return mismatch("batch_size", saved.batch_size, st->batch_size);
  if (saved.seq_len != st->seq_len) return mismatch("seq_len", saved.seq_len, st->seq_len);
  if (saved.shuffle != st->shuffle) return mismatch("data.shuffle", saved.shuffle, st->shuffle);
  if (saved.data_seed != st->data_seed) return mismatch("data.seed", saved.data_seed, st->data_seed);
  if (saved.data_path != st->data_path) return mismatch("data.path", saved.data_path, st->data_path);
  // A LoRA run resumes from adapters, a full fine-tuning run from a whole model: never the other.
  const bool has_adapter = fs::exists(fs::path(dir) / "adapter_model.safetensors");
  if (has_adapter != model->lora()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot resume from ", dir, ": it is a ", has_adapter ? "LoRA" : "full fine-tuning",
        " checkpoint and this run is ", model->lora() ? "LoRA" : "full fine-tuning",
        " (use a new checkpoint.dir, or set spec.lora as the checkpoint was written)"));
  }
  if (auto s = model->lora() ? model->LoadAdapters(dir) : model->LoadWeights(dir); !s.ok()) return s;
  auto file = SafetensorsFile::Open((fs::path(dir) / "optimizer.safetensors").string());
  if (!file.ok()) return file.status();
  auto lookup = [&](const std::string& key) -> absl::StatusOr<torch::Tensor> {
    const TensorInfo* info = (*file)->Find(key);
    if (info == nullptr) return absl::DataLossError(absl::StrCat(dir, "/optimizer.safetensors: \"", key, "\" is missing"));
    auto dt = TorchDType(info->dtype);
    if (!dt.ok()) return dt.status();
    return torch::from_blob(const_cast<std::byte*>((*file)->data(*info)), info->shape, torch::TensorOptions().dtype(*dt))
        .clone();
  };
  if (auto s = opt->LoadState(lookup); !s.ok()) return s;
  auto rng = lookup("rng.cpu");
  if (!rng.ok()) return rng.status();
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(*rng);
  *st = saved;
  return absl::OkStatus();
}

}  // namespace ftd::engine

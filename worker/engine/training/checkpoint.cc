#include "worker/engine/training/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "worker/engine/core/fs_util.h"
#include "worker/engine/torch_util.h"

namespace ftd::engine {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kFormat[] = "ftd-checkpoint-1";
// Besides these, a full checkpoint and a merged LoRA model hold the model's other files
// (LlamaModel::hf_files(): config.json, generation_config.json, the tokenizer's).
const char* const kFiles[] = {"model.safetensors", "model.safetensors.index.json", "optimizer.safetensors",
                              "trainer_state.json"};
// LoRA: the adapters in PEFT's format instead of the model; the base stays where it was read from.
const char* const kLoraFiles[] = {"adapter_model.safetensors", "adapter_config.json", "optimizer.safetensors",
                                  "trainer_state.json"};

// model.safetensors.index.json naming model.safetensors as the file of every weight. Loaders that
// read every *.safetensors file of a directory unless an index names the weights' files (vLLM's,
// SGLang's) would otherwise read optimizer.safetensors as weights too; transformers and ftd read
// model.safetensors, which the index names.
std::string WeightIndexJson(const LlamaModel& model) {
  json index = {{"metadata", {{"total_size", TensorBytes(model.named_parameters())}}}, {"weight_map", json::object()}};
  for (const auto& [name, t] : model.named_parameters()) index["weight_map"][name] = "model.safetensors";
  return index.dump(2);
}

// "step-00000042" -> 42 (8 digits or more); any other name -> nullopt.
std::optional<int64_t> StepOf(const fs::path& p) {
  const std::string n = p.filename().string();
  if (n.size() < 13 || n.size() > 23 || n.rfind("step-", 0) != 0) return std::nullopt;
  if (n.find_first_not_of("0123456789", 5) != std::string::npos) return std::nullopt;
  return std::stoll(n.substr(5));
}

// A directory being written, or left behind by a writer that died: "step-<anything>.tmp".
bool IsPartial(const std::string& name) {
  return name.size() > 9 && name.rfind("step-", 0) == 0 && name.compare(name.size() - 4, 4, ".tmp") == 0;
}

bool Complete(const fs::path& dir) {
  auto text = ReadRegularFile((dir / "MANIFEST.json").string(), "");
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

absl::Status RemoveTree(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);  // a symbolic link is removed, not followed
  if (ec) return absl::InternalError(absl::StrCat("remove ", p.string(), ": ", ec.message()));
  return absl::OkStatus();
}

// Moves the written directory `tmp` to `final_dir`. Where final_dir exists already (a run that
// started over with checkpoint.resume off reaches a step it had checkpointed before) the two are
// exchanged in one rename, so that a complete final_dir exists at every instant, and `*old` is set
// to where the replaced checkpoint now is (under tmp's name), to remove once the rename is durable.
absl::Status Publish(const fs::path& tmp, const fs::path& final_dir, std::optional<fs::path>* old) {
  if (::rename(tmp.c_str(), final_dir.c_str()) == 0) return absl::OkStatus();
  if (errno != ENOTEMPTY && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("rename ", tmp.string(), ": ", std::strerror(errno)));
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    *old = tmp;
    return absl::OkStatus();
  }
  if (errno != EINVAL && errno != ENOSYS) {
    return absl::InternalError(absl::StrCat("exchange ", tmp.string(), ": ", std::strerror(errno)));
  }
  // A filesystem without RENAME_EXCHANGE: move the old one aside (under a partial name, so that a
  // crash here leaves something the next writer removes), then rename.
  const fs::path aside = fs::path(final_dir.string() + ".replaced.tmp");
  if (::rename(final_dir.c_str(), aside.c_str()) != 0 || ::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename ", tmp.string(), ": ", std::strerror(errno)));
  }
  *old = aside;
  return absl::OkStatus();
}

// Keeps `written` and the keep_last - 1 newest other complete checkpoints. Each one removed is
// first renamed to a partial name: a crash while removing it leaves nothing a loader would take.
absl::Status Prune(const fs::path& root, const fs::path& written, int keep_last) {
  std::vector<std::pair<int64_t, fs::path>> others;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (e.path() == written) continue;
    if (auto step = StepOf(e.path()); step && Complete(e.path())) others.emplace_back(*step, e.path());
  }
  if (ec) return absl::InternalError(absl::StrCat("list ", root.string(), ": ", ec.message()));
  std::sort(others.begin(), others.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = static_cast<size_t>(keep_last - 1); i < others.size(); ++i) {
    const fs::path victim = others[i].second;
    const fs::path doomed = fs::path(victim.string() + ".pruned.tmp");
    if (::rename(victim.c_str(), doomed.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("rename ", victim.string(), ": ", std::strerror(errno)));
    }
    if (auto s = RemoveTree(doomed); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

std::string OptimizerShardName(int rank, int world) {
  return absl::StrCat("optimizer-rank-", rank, "-of-", world, ".safetensors");
}

absl::StatusOr<std::string> SaveCheckpoint(const std::string& root, const TrainerState& st, const LlamaModel& model,
                                           const AdamW& opt, int keep_last, bool merged,
                                           const ProgressFn& progress, std::function<bool()> abort,
                                           const CheckpointRanks& ranks) {
  const bool sharded = ranks.world > 1;
  const std::string name = absl::StrFormat("step-%08d", st.step);
  const fs::path final_dir = fs::path(root) / name;
  const fs::path tmp = fs::path(root) / (name + ".tmp");
  if (sharded && ranks.rank != 0) {  // this rank's shard, into the directory rank 0 made
    ranks.barrier();
    ProgressMeter meter(progress, ProgressPhase::kSaveCheckpoint, TensorBytes(opt.State()));
    auto s = WriteTensors((tmp / OptimizerShardName(ranks.rank, ranks.world)).string(), opt.State(), {}, &meter);
    ranks.barrier();  // after it, whatever this rank wrote is rank 0's to publish
    if (!s.ok()) return s;
    meter.Finish();
    return final_dir.string();
  }
  if (auto s = EnsureDirectory(root, "spec.checkpoint.dir"); !s.ok()) return s;
  std::error_code ec;
  // Held until the checkpoint is in place and pruned. The kernel releases it when a writer dies,
  // so every partial checkpoint found while holding it was left by a writer that is gone.
  auto lock = DirLock::Acquire(root);
  if (!lock.ok()) return lock.status();
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (!IsPartial(e.path().filename().string())) continue;
    if (auto s = RemoveTree(e.path()); !s.ok()) return s;
  }
  if (ec) return absl::InternalError(absl::StrCat("list ", root, ": ", ec.message()));

  if (!fs::create_directory(tmp, ec) || ec) {
    return absl::InternalError(absl::StrCat("create ", tmp.string(), ": ", ec ? ec.message() : "exists"));
  }
  // Until it is published, a failed or stopped write removes its partial directory (under the lock).
  struct RemovePartial {
    const fs::path& dir;
    bool published = false;
    ~RemovePartial() {
      if (!published) (void)RemoveTree(dir);
    }
  } partial{tmp};
  if (sharded) ranks.barrier();  // the other ranks write their shards now

  // Optimizer state and RNG states.
  NamedTensors state_tensors = opt.State();
  state_tensors.emplace_back("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
  const uint64_t model_bytes = model.lora() ? TensorBytes(model.trainable_parameters()) +
                                                  (merged ? TensorBytes(model.named_parameters()) : 0)
                                            : TensorBytes(model.named_parameters());
  ProgressMeter meter(progress, ProgressPhase::kSaveCheckpoint, model_bytes + TensorBytes(state_tensors));
  // A sharded write is never stopped part-way: the other ranks wait for rank 0 at the barriers
  // below, so every rank runs the write to its end.
  if (!sharded) meter.SetAbort(std::move(abort));
  if (model.lora()) {
    if (auto s = model.SaveAdapters(tmp.string(), &meter); !s.ok()) return s;
    if (merged) {
      if (!fs::create_directory(tmp / "merged", ec) || ec) {
        return absl::InternalError(absl::StrCat("create ", (tmp / "merged").string(), ": ", ec.message()));
      }
      if (auto s = model.SaveMerged((tmp / "merged").string(), &meter); !s.ok()) return s;
      if (auto s = FsyncDir((tmp / "merged").string()); !s.ok()) return s;
    }
  } else {
    if (auto s = model.SaveWeights(tmp.string(), &meter); !s.ok()) return s;
    if (auto s = WriteFileSynced((tmp / "model.safetensors.index.json").string(), WeightIndexJson(model)); !s.ok()) {
      return s;
    }
  }
  const std::string opt_file = sharded ? OptimizerShardName(0, ranks.world) : "optimizer.safetensors";
  if (auto s = WriteTensors((tmp / opt_file).string(), state_tensors, {}, &meter); !s.ok()) return s;

  json state = {{"step", st.step},           {"micro_batches", st.micro_batches}, {"tokens_total", st.tokens_total},
                {"batch_size", st.batch_size}, {"seq_len", st.seq_len},           {"shuffle", st.shuffle},
                {"data_seed", st.data_seed}, {"data_path", st.data_path}};
  if (auto s = WriteFileSynced((tmp / "trainer_state.json").string(), state.dump(2)); !s.ok()) return s;

  if (sharded) ranks.barrier();  // every shard is written (and synced)
  json manifest = {{"format", kFormat}, {"step", st.step}, {"files", json::object()}};
  std::vector<std::string> files;
  for (const char* f : kFiles) {
    if (!model.lora()) files.emplace_back(f);
  }
  for (const char* f : kLoraFiles) {
    if (model.lora()) files.emplace_back(f);
  }
  for (const std::string& f : model.hf_files().names()) {
    if (!model.lora()) files.push_back(f);
    if (model.lora() && merged) files.push_back("merged/" + f);
  }
  if (model.lora() && merged) files.emplace_back("merged/model.safetensors");
  if (sharded) {
    std::erase(files, std::string("optimizer.safetensors"));
    for (int r = 0; r < ranks.world; ++r) files.push_back(OptimizerShardName(r, ranks.world));
    manifest["optimizer_shards"] = ranks.world;
  }
  for (const auto& f : files) {
    const uint64_t size = fs::file_size(tmp / f, ec);
    if (ec) return absl::InternalError(absl::StrCat("checkpoint file ", (tmp / f).string(), ": ", ec.message()));
    manifest["files"][f] = size;
  }
  if (auto s = WriteFileSynced((tmp / "MANIFEST.json").string(), manifest.dump(2)); !s.ok()) return s;
  if (auto s = FsyncDir(tmp.string()); !s.ok()) return s;
  std::optional<fs::path> replaced;
  if (meter.Aborted()) return absl::CancelledError(absl::StrCat("write of ", tmp.string(), " stopped"));
  if (auto s = Publish(tmp, final_dir, &replaced); !s.ok()) return s;
  partial.published = true;
  if (auto s = FsyncDir(root); !s.ok()) return s;
  if (replaced) {
    if (auto s = RemoveTree(*replaced); !s.ok()) return s;
  }
  meter.Finish();
  if (keep_last > 0) {
    if (auto s = Prune(root, final_dir, keep_last); !s.ok()) return s;
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

absl::Status LoadCheckpoint(const std::string& dir, TrainerState* st, LlamaModel* model, AdamW* opt,
                            const ProgressFn& progress) {
  auto text = ReadRegularFile((fs::path(dir) / "trainer_state.json").string(), "");
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
  // The spec disagrees with the checkpoint: the spec's to fix (InvalidArgument: an invalid spec).
  auto mismatch = [&](const char* field, auto a, auto b) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resume from ", dir, ": spec.", field, " is ", b,
                                                      " but the checkpoint was written with ", a,
                                                      " (use the same value, or a new checkpoint.dir)"));
  };
  if (saved.batch_size != st->batch_size) {
    return mismatch("batch_size x spec.gpus (the batch of all ranks)", saved.batch_size, st->batch_size);
  }
  if (saved.seq_len != st->seq_len) return mismatch("seq_len", saved.seq_len, st->seq_len);
  if (saved.shuffle != st->shuffle) return mismatch("data.shuffle", saved.shuffle, st->shuffle);
  if (saved.data_seed != st->data_seed) return mismatch("data.seed", saved.data_seed, st->data_seed);
  if (saved.data_path != st->data_path) return mismatch("data.path", saved.data_path, st->data_path);
  // A LoRA run resumes from adapters, a full fine-tuning run from a whole model: never the other.
  const bool has_adapter = fs::exists(fs::path(dir) / "adapter_model.safetensors");
  if (has_adapter != model->lora()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot resume from ", dir, ": it is a ", has_adapter ? "LoRA" : "full fine-tuning",
        " checkpoint and this run is ", model->lora() ? "LoRA" : "full fine-tuning",
        " (use a new checkpoint.dir, or set spec.lora as the checkpoint was written)"));
  }
  ProgressMeter meter(progress, ProgressPhase::kLoadCheckpoint, 0);
  if (auto s = model->lora() ? model->LoadAdapters(dir) : model->LoadWeights(dir, &meter); !s.ok()) return s;
  // optimizer.safetensors, or a sharded run's optimizer-rank-<r>-of-<n>.safetensors (any n).
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    if (f != "optimizer.safetensors" && !(f.rfind("optimizer-rank-", 0) == 0 && f.ends_with(".safetensors"))) continue;
    auto file = SafetensorsFile::Open(e.path().string());
    if (!file.ok()) return file.status();
    for (const auto& t : (*file)->tensors()) meter.AddTotal(t.end - t.begin);
    files.push_back(*std::move(file));
  }
  if (ec) return absl::InternalError(absl::StrCat("list ", dir, ": ", ec.message()));
  auto lookup = [&](const std::string& key) -> absl::StatusOr<torch::Tensor> {
    for (const auto& file : files) {
      const TensorInfo* info = file->Find(key);
      if (info == nullptr) continue;
      auto dt = TorchDType(info->dtype);
      if (!dt.ok()) return dt.status();
      auto t = torch::from_blob(const_cast<std::byte*>(file->data(*info)), info->shape, torch::TensorOptions().dtype(*dt))
                   .clone();
      meter.Add(info->end - info->begin);
      return t;
    }
    return absl::DataLossError(absl::StrCat(dir, ": optimizer state \"", key, "\" is missing"));
  };
  if (auto s = opt->LoadState(lookup); !s.ok()) return s;
  auto rng = lookup("rng.cpu");
  if (!rng.ok()) return rng.status();
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(*rng);
  *st = saved;
  meter.Finish();
  return absl::OkStatus();
}

}  // namespace ftd::engine

// A data-parallel run's collective parts: joining the job's ranks (rank 0's weights sent to all,
// the gradient reducer built, reduce-scattering under ZeRO-2), agreeing on each step's stop request
// and token counts, the global gradient norm whichever rank holds which gradients, ZeRO's gather of
// the updated weights from the ranks that own them, and each step's per-rank GPU peak,
// communication wait, gradient bytes and GPU power sample (NVML) shared for rank 0's report.
#include "worker/engine/training/training_run.h"

#include <algorithm>

#include <c10/cuda/CUDACachingAllocator.h>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ftd::engine {

bool TrainingRun::SetupRanks(const std::vector<torch::Tensor>& trainable) {
  auto ranks = Ranks::Join(rank_.rank, world_, rank_.store_path, device_, std::chrono::seconds(rank_.timeout_s));
  if (!ranks.ok()) return Fail(Outcome::kFailed, std::string(ranks.status().message()));
  ranks_ = *std::move(ranks);
  // The same seed gives every rank the same initial weights; rank 0's are sent anyway, so that no
  // rank can start from others (a device whose initialisation differs, a file read differently).
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : model_->named_parameters()) {
    torch::Tensor p = t;
    ranks_->Broadcast(p, 0);
  }
  if (shard_grads() && device_.is_cuda() && ranks_->backend_name() != "nccl") {
    return Fail(Outcome::kInvalidSpec,
                absl::StrCat("spec.optimizer.shard_grads on GPUs needs NCCL, and this ftd-worker was built without "
                             "ProcessGroupNCCL (ranks join through ", ranks_->backend_name(),
                             "): set optimizer.shard_grads false, or rebuild with NCCL (docs/distributed.md)"));
  }
  const int64_t bucket_bytes = rank_.bucket_mib > 0 ? int64_t{rank_.bucket_mib} << 20 : GradReducer::kBucketBytes;
  // In place is c10d allreduce_coalesced: NCCL on GPUs, Gloo on CPU tensors (tested). GPU tensors on
  // Gloo (a build without NCCL) keep the flat bucket, the path Gloo's plain allreduce stages to the host.
  const bool in_place = !rank_.flat_reduce && !shard_grads() && (ranks_->backend_name() == "nccl" || !device_.is_cuda());
  reducer_ = std::make_unique<GradReducer>(*ranks_, trainable, bucket_bytes,
                                           shard_grads() ? owner_ : std::vector<int>{}, in_place);
  Log(absl::StrCat(ranks_->backend_name(), ": ", reducer_->num_buckets(), " gradient buckets of about ",
                   bucket_bytes >> 20, " MiB", shard_grads() ? ", reduce-scattered" : "",
                   in_place ? ", all-reduced in place (one coalesced group per bucket)" : "",
                   rank_.flat_reduce && shard_grads() ? " (--flat-reduce does not apply to shard_grads)" : ""));
  return true;
}

void TrainingRun::AgreeOnStep(bool* stop, bool* skip_checkpoint, int64_t* real_tokens, int64_t* loss_tokens) {
  // Doubles hold the counts exactly (far below 2^53).
  torch::Tensor v = torch::tensor({*stop ? 1.0 : 0.0, *skip_checkpoint ? 1.0 : 0.0, static_cast<double>(*real_tokens),
                                   static_cast<double>(*loss_tokens)},
                                  torch::TensorOptions().dtype(torch::kDouble))
                        .to(device_);
  ranks_->AllReduceSum(v);
  v = v.to(torch::kCPU);
  const double* d = v.data_ptr<double>();
  // One rank asked to stop (a signal reaches every rank of the job's group, not at the same step):
  // all stop after the same step. A cancel without checkpoint wins over a stop with one.
  *stop = d[0] > 0;
  *skip_checkpoint = d[1] > 0;
  *real_tokens = static_cast<int64_t>(d[2]);
  *loss_tokens = static_cast<int64_t>(d[3]);
}

void TrainingRun::GatherUpdatedWeights() {
  torch::NoGradGuard no_grad;
  (void)ranks_->BroadcastEach(trainable_, owner_, rank_.coalesced_gather);
}

torch::Tensor TrainingRun::GlobalGradNorm() {
  if (owner_.empty()) return opt_->GradNorm();  // one rank, or every rank holds every reduced gradient
  std::vector<torch::Tensor> grads;
  for (auto& t : trainable_) {
    if (t.grad().defined()) grads.push_back(t.grad());
  }
  if (!shard_grads()) return GradNorm(grads, kernels_[KernelOp::kAdamW]);
  // ZeRO-2: each rank holds its own tensors' gradients; one scalar all-reduce adds the squares.
  torch::Tensor sq = torch::zeros({1}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  if (!grads.empty()) sq += GradNorm(grads, kernels_[KernelOp::kAdamW]).to(torch::kDouble).square();
  ranks_->AllReduceSum(sq);
  return sq.sqrt().to(torch::kFloat).reshape({});
}

std::vector<double> TrainingRun::ShareRows(const std::vector<double>& row) {
  const int64_t n = static_cast<int64_t>(row.size());
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  torch::Tensor v = torch::zeros({world_ * n}, f64);
  v.narrow(0, rank_.rank * n, n).copy_(torch::tensor(row, f64));
  v = v.to(device_);
  ranks_->AllReduceSum(v);
  v = v.to(torch::kCPU).contiguous();
  return std::vector<double>(v.data_ptr<double>(), v.data_ptr<double>() + world_ * n);
}

namespace {

// A GPU sample as a row of doubles (bytes exact below 2^53), and back.
constexpr size_t kSampleRow = 5;
void AppendSample(const GpuMonitor::Sample& s, std::vector<double>* row) {
  row->insert(row->end(), {s.ok ? 1.0 : 0.0, s.energy_j, s.power_w, s.utilization, static_cast<double>(s.memory_used_bytes)});
}
GpuMonitor::Sample SampleAt(const double* d) {
  GpuMonitor::Sample s;
  s.ok = d[0] > 0;
  s.energy_j = d[1];
  s.power_w = d[2];
  s.utilization = d[3];
  s.memory_used_bytes = static_cast<uint64_t>(d[4]);
  return s;
}

}  // namespace

GpuMonitor::Sample TrainingRun::ReadJobGpus() {
  const GpuMonitor::Sample own = gpu_->available() ? gpu_->Read() : GpuMonitor::Sample{};
  if (world_ == 1) return own;
  std::vector<double> row;
  AppendSample(own, &row);
  const std::vector<double> all = ShareRows(row);
  std::vector<GpuMonitor::Sample> per_gpu;
  for (int r = 0; r < world_; ++r) per_gpu.push_back(SampleAt(&all[static_cast<size_t>(r) * kSampleRow]));
  return CombineGpuSamples(per_gpu);
}

void TrainingRun::ShareRankStats(const GpuMonitor::Sample& own_gpu) {
  uint64_t peak = 0;
  if (device_.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    peak = static_cast<uint64_t>(stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak);
  }
  std::vector<double> row = {static_cast<double>(peak), reducer_->ReadWait(), static_cast<double>(grad_bytes_)};
  AppendSample(own_gpu, &row);
  const size_t n = row.size();
  const std::vector<double> all = ShareRows(row);
  std::vector<GpuMonitor::Sample> per_gpu;
  comm_wait_s_ = 0;
  max_rank_peak_ = 0;
  std::vector<std::string> peaks;
  sum_.rank_grad_bytes.assign(static_cast<size_t>(world_), 0);
  for (int r = 0; r < world_; ++r) {
    const double* d = &all[static_cast<size_t>(r) * n];
    sum_.rank_grad_bytes[static_cast<size_t>(r)] = static_cast<uint64_t>(d[2]);
    comm_wait_s_ = std::max(comm_wait_s_, d[1]);  // the step waits for the slowest rank
    max_rank_peak_ = std::max(max_rank_peak_, static_cast<uint64_t>(d[0]));
    peaks.push_back(absl::StrFormat("%.2f", d[0] / (1 << 30)));
    per_gpu.push_back(SampleAt(d + 3));
  }
  job_gpu_ = CombineGpuSamples(per_gpu);
  if (lead() && device_.is_cuda() && (state_.step == 0 || state_.step + 1 == cfg_.steps)) {
    Log(absl::StrCat("GPU peak memory allocated per rank (GiB): ", absl::StrJoin(peaks, ", ")));
  }
}

}  // namespace ftd::engine

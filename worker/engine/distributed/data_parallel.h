// Data parallelism over LibTorch's c10d (docs/distributed.md): the ranks of one job meet at a c10d
// FileStore, then talk through a process group: NCCL between GPUs where this build has
// ProcessGroupNCCL, Gloo otherwise (CPU ranks in CI; GPU tensors staged through the host).
// No collective of our own: every reduction is a c10d call.
//
// GradReducer sums the gradients over the ranks in buckets of about 256 MiB, each launched from a
// post-accumulate-grad hook the moment its last gradient is final, so the reductions run while
// backward computes the earlier layers (the bucketing DDP does). Unsharded, a bucket's gradients are
// all-reduced where autograd left them, as one coalesced group (no copy into a flat tensor: 16 GB of
// reads and writes a step less at 8B); 256 MiB and in place measured fastest (docs/performance.md). The trainer normalises the loss by
// the global count of loss tokens, so the sum is the gradient of the combined batch.
#pragma once

#include <ATen/cuda/CUDAEvent.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ftd::engine {

class Ranks {
 public:
  // Joins `world` ranks as `rank` through the FileStore at `store_path` (every rank the same path,
  // new for each attempt). The backend is NCCL for a CUDA device when built with it, else Gloo.
  static absl::StatusOr<std::unique_ptr<Ranks>> Join(int rank, int world, const std::string& store_path,
                                                     const torch::Device& device, std::chrono::milliseconds timeout);
  int rank() const { return rank_; }
  int world() const { return world_; }
  const std::string& backend_name() const { return backend_name_; }
  c10d::Backend& backend() { return *backend_; }

  // In place, blocking: the sum over the ranks.
  void AllReduceSum(torch::Tensor& t);
  // In place, blocking: `root`'s value on every rank.
  void Broadcast(torch::Tensor& t, int root);
  // In place: tensors[k] from roots[k] on every rank. With `coalesce` on a backend that supports it
  // (NCCL) the broadcasts are launched as one group, so those from different roots run at once;
  // otherwise one after another. Returns whether they were coalesced.
  bool BroadcastEach(std::vector<torch::Tensor>& tensors, const std::vector<int>& roots, bool coalesce);
  // Every rank reaches this point (a one-element all-reduce: the same call for Gloo and NCCL).
  void Barrier();

 private:
  Ranks() = default;
  int rank_ = 0, world_ = 1;
  std::string backend_name_;
  torch::Device device_{torch::kCPU};
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> backend_;
};

// ZeRO-2 (`owners` given): each bucket is laid out owner by owner and reduce-scattered (c10d
// reduce_scatter, SUM, one part per rank, parts of any size, empty ones included), so each rank
// receives the sums of the gradients it owns and keeps nothing of the others': their gradients are
// released when the bucket is launched, and the bucket itself once its reduction is done. At most
// kMaxInFlight buckets are in flight; launching another first waits for the oldest. The CPU path
// needs no stand-in: ProcessGroupGloo in LibTorch 2.11 takes reduce_scatter on CPU tensors with
// parts of different sizes, empty ones included. ProcessGroupNCCL runs parts of different sizes as
// one group of ncclReduce calls (one per owner) and equal parts as one ncclReduceScatter.
class GradReducer {
 public:
  static constexpr int64_t kBucketBytes = 256 << 20;  // measured: docs/performance.md
  static constexpr int kMaxInFlight = 2;  // ZeRO-2: buckets whose reduction may be pending at once
  // `params`: the trainable parameters, in the model's order (buckets are cut in reverse order,
  // the order backward produces them in). Installs a post-accumulate-grad hook on each. `owners`
  // (ZeRO-2; empty: every rank keeps every reduced gradient): the rank that keeps each one's.
  // `in_place` (unsharded only): each bucket's gradients are all-reduced where autograd left them,
  // as one coalesced group of collectives (c10d allreduce_coalesced), instead of being copied into one
  // flat tensor that is reduced and that the gradients then view.
  GradReducer(Ranks& ranks, const std::vector<torch::Tensor>& params, int64_t bucket_bytes = kBucketBytes,
              std::vector<int> owners = {}, bool in_place = true);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // The next backward pass completes the step's gradients: reduce each bucket as it becomes final.
  void Arm();
  // After that backward: reduces what no hook launched and waits for every bucket; the gradients
  // are then views of the reduced buckets (ZeRO-2: of this rank's parts; the others' undefined). Returns the seconds this took (the communication backward did not
  // hide): wall time on the CPU; on a GPU, CUDA events read by ReadWait() after the step syncs.
  void Finish();
  double ReadWait();
  int num_buckets() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<size_t> params;  // ZeRO-2: grouped by owner, owner 0 first
    std::vector<int64_t> part;   // ZeRO-2: elements of each rank's part
    int ready = 0;
    bool launched = false;
    torch::Tensor flat;
    torch::Tensor mine;          // ZeRO-2: this rank's part, reduced
    c10::intrusive_ptr<c10d::Work> work;
  };
  friend struct ReadyHook;
  void Ready(size_t param);
  void Launch(Bucket& b);
  // Waits for a launched bucket's reduction and points the gradients at its result.
  void Retire(Bucket& b);

  Ranks& ranks_;
  std::vector<torch::Tensor> params_;
  std::vector<int> owners_;
  bool in_place_ = false;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<size_t> in_flight_;  // ZeRO-2: launched, not retired, oldest first
  std::mutex mu_;
  bool armed_ = false;
  double wait_s_ = 0;
  bool cuda_ = false;
  std::vector<at::cuda::CUDAEvent> events_;  // GPU: around Finish's waits
};

// The owner of each parameter under ZeRO-1 and ZeRO-2: greedy by size, so each rank holds about 1/world of
// the elements. Deterministic: every rank computes the same assignment.
std::vector<int> ShardOwners(const std::vector<torch::Tensor>& params, int world);

}  // namespace ftd::engine

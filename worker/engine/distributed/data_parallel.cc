#include "worker/engine/distributed/data_parallel.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#if FTD_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace ftd::engine {

#if FTD_HAVE_NCCL
// data_parallel_nccl.cc: the one translation unit that includes ProcessGroupNCCL.hpp (and nccl.h).
c10::intrusive_ptr<c10d::Backend> MakeNcclBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
                                                  std::chrono::milliseconds timeout);
#endif

absl::StatusOr<std::unique_ptr<Ranks>> Ranks::Join(int rank, int world, const std::string& store_path,
                                                   const torch::Device& device, std::chrono::milliseconds timeout) {
  if (world < 2 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of ", world, " is not a rank of a data-parallel job"));
  }
  if (store_path.empty()) {
    return absl::InvalidArgumentError("a data-parallel rank needs the path of its job's c10d store (--store)");
  }
  std::unique_ptr<Ranks> r(new Ranks());
  r->rank_ = rank;
  r->world_ = world;
  r->device_ = device;
  try {
    auto store = c10::make_intrusive<c10d::FileStore>(store_path, world);
    store->setTimeout(timeout);
    r->store_ = store;
#if FTD_HAVE_NCCL
    if (device.is_cuda()) {
      r->backend_ = MakeNcclBackend(r->store_, rank, world, timeout);
      r->backend_name_ = "nccl";
    }
#endif
#if FTD_HAVE_GLOO
    if (!r->backend_) {
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      // One host: the ranks meet on loopback (docs/distributed.md says what several hosts need).
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      r->backend_ = c10::make_intrusive<c10d::ProcessGroupGloo>(r->store_, rank, world, opts);
      r->backend_name_ = "gloo";
    }
#endif
    if (!r->backend_) {
      return absl::FailedPreconditionError(
          "this ftd-worker was built without Gloo's headers (Debian's libgloo-dev), so data-parallel ranks can only "
          "join through NCCL on GPUs: install libgloo-dev and rebuild, or run with spec.gpus 1");
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", rank, " of ", world, " could not join its job's ranks through ",
                                               store_path, ": ", e.what()));
  }
  return r;
}

void Ranks::AllReduceSum(torch::Tensor& t) {
  std::vector<torch::Tensor> v{t};
  backend_->allreduce(v)->wait();
}

void Ranks::Broadcast(torch::Tensor& t, int root) {
  std::vector<torch::Tensor> v{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  backend_->broadcast(v, o)->wait();
}

bool Ranks::BroadcastEach(std::vector<torch::Tensor>& tensors, const std::vector<int>& roots, bool coalesce) {
  coalesce = coalesce && backend_->supportsCoalescing();
  if (!coalesce) {
    for (size_t k = 0; k < tensors.size(); ++k) Broadcast(tensors[k], roots[k]);
    return false;
  }
  backend_->startCoalescing();
  for (size_t k = 0; k < tensors.size(); ++k) {
    std::vector<torch::Tensor> v{tensors[k]};
    c10d::BroadcastOptions o;
    o.rootRank = roots[k];
    backend_->broadcast(v, o);
  }
  backend_->endCoalescing()->wait();
  return true;
}

void Ranks::Barrier() {
  torch::Tensor one = torch::ones({1}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
  AllReduceSum(one);
  if (device_.is_cuda()) (void)one.item<float>();  // the host waits too
}

// Tells the reducer a parameter's gradient is final for this backward pass.
struct ReadyHook final : torch::autograd::PostAccumulateGradHook {
  ReadyHook(GradReducer* r, size_t i) : reducer(r), index(i) {}
  void operator()(const torch::autograd::Variable&) override { reducer->Ready(index); }
  GradReducer* reducer;
  size_t index;
};

GradReducer::GradReducer(Ranks& ranks, const std::vector<torch::Tensor>& params, int64_t bucket_bytes,
                         std::vector<int> owners, bool in_place)
    : ranks_(ranks), params_(params), owners_(std::move(owners)), in_place_(in_place && owners_.empty()),
      bucket_of_(params.size()) {
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const auto& p = params_[k];
    const bool new_bucket = buckets_.empty() || bytes >= bucket_bytes ||
                            params_[buckets_.back().params.front()].scalar_type() != p.scalar_type();
    if (new_bucket) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().params.push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    bytes += p.numel() * p.element_size();
  }
  if (!owners_.empty()) {  // ZeRO-2: each bucket owner by owner, so that rank r's part is contiguous
    for (auto& b : buckets_) {
      std::stable_sort(b.params.begin(), b.params.end(), [&](size_t x, size_t y) { return owners_[x] < owners_[y]; });
      b.part.assign(static_cast<size_t>(ranks_.world()), 0);
      for (size_t k : b.params) b.part[static_cast<size_t>(owners_[k])] += params_[k].numel();
    }
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    torch::autograd::impl::set_post_acc_grad_hooks(params_[k], std::make_unique<ReadyHook>(this, k));
  }
  cuda_ = !params_.empty() && params_.front().is_cuda();
  if (cuda_) {
    events_.emplace_back(cudaEventDefault);
    events_.emplace_back(cudaEventDefault);
  }
}

GradReducer::~GradReducer() {
  for (auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

void GradReducer::Arm() {
  std::lock_guard<std::mutex> l(mu_);
  armed_ = true;
  for (auto& b : buckets_) {
    b.ready = 0;
    b.launched = false;
  }
}

void GradReducer::Ready(size_t param) {
  std::lock_guard<std::mutex> l(mu_);
  if (!armed_) return;
  Bucket& b = buckets_[bucket_of_[param]];
  if (++b.ready == static_cast<int>(b.params.size())) Launch(b);
}

void GradReducer::Launch(Bucket& b) {
  std::vector<torch::Tensor> flat;
  flat.reserve(b.params.size());
  for (size_t k : b.params) {
    auto& p = params_[k];
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);  // unused this step: contributes zero
    if (in_place_ && !p.grad().is_contiguous()) p.mutable_grad() = p.grad().contiguous();
    flat.push_back(in_place_ ? p.grad() : p.grad().reshape({-1}));
  }
  if (in_place_) {
    // No copy: the collectives read and write the gradients themselves (one NCCL group per bucket).
    b.launched = true;
    b.work = ranks_.backend().allreduce_coalesced(flat);
    return;
  }
  b.flat = torch::cat(flat);
  b.launched = true;
  if (!owners_.empty()) {
    // ZeRO-2: the bucket holds the only copy now; this rank's part of the sums arrives in `mine`.
    for (size_t k : b.params) params_[k].mutable_grad() = torch::Tensor();
    std::vector<std::vector<torch::Tensor>> in{b.flat.split_with_sizes(b.part)};
    b.mine = torch::empty({b.part[static_cast<size_t>(ranks_.rank())]}, b.flat.options());
    std::vector<torch::Tensor> out{b.mine};
    b.work = ranks_.backend().reduce_scatter(out, in);
    in_flight_.push_back(static_cast<size_t>(&b - buckets_.data()));
    while (static_cast<int>(in_flight_.size()) > kMaxInFlight) Retire(buckets_[in_flight_.front()]);
    return;
  }
  // The gradients become views of the bucket, which is reduced in place: the originals are freed
  // now, so the reduction costs no second copy of the gradients (DDP's gradient_as_bucket_view).
  int64_t off = 0;
  for (size_t k : b.params) {
    auto& p = params_[k];
    const int64_t n = p.numel();
    p.mutable_grad() = b.flat.slice(0, off, off + n).view(p.sizes());
    off += n;
  }
  std::vector<torch::Tensor> v{b.flat};
  b.work = ranks_.backend().allreduce(v);
}

void GradReducer::Retire(Bucket& b) {
  if (!b.work) return;
  b.work->wait();  // the sums are in place (GPU: once the stream gets here)
  b.work.reset();
  b.flat = torch::Tensor();  // unsharded: the gradients, views of it, keep it until ZeroGrad
  if (owners_.empty()) return;
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), static_cast<size_t>(&b - buckets_.data())));
  int64_t off = 0;
  for (size_t k : b.params) {
    if (owners_[k] != ranks_.rank()) continue;
    auto& p = params_[k];
    const int64_t n = p.numel();
    p.mutable_grad() = b.mine.slice(0, off, off + n).view(p.sizes());
    off += n;
  }
  b.mine = torch::Tensor();  // its views keep it
}

void GradReducer::Finish() {
  const auto t0 = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> l(mu_);
  torch::NoGradGuard no_grad;
  if (cuda_) events_[0].record();
  for (auto& b : buckets_) {
    if (!b.launched) Launch(b);
  }
  for (auto& b : buckets_) Retire(b);
  armed_ = false;
  if (cuda_) events_[1].record();
  wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double GradReducer::ReadWait() {
  if (cuda_) return events_[0].elapsed_time(events_[1]) / 1e3;
  return wait_s_;
}

std::vector<int> ShardOwners(const std::vector<torch::Tensor>& params, int world) {
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), 0);
  // Largest first, ties in model order: a balanced greedy assignment.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return params[a].numel() > params[b].numel(); });
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  std::vector<int> owner(params.size(), 0);
  for (size_t k : order) {
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[k] = static_cast<int>(r);
    load[r] += params[k].numel();
  }
  return owner;
}

}  // namespace ftd::engine

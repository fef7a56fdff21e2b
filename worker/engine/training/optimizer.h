// AdamW over the model's parameters, through LibTorch's fused kernel (at::_fused_adamw_, the
// implementation behind torch.optim.AdamW(fused=True), on CUDA and CPU). Decoupled weight decay
// applies to tensors of rank >= 2 (projections, embeddings); norms' weights are not decayed.
// Optional fp32 master weights: the step runs on fp32 copies and is written back to bf16.
//
// Overlap (spec.optimizer.overlap): the update runs inside backward, group by group (one decoder
// layer's parameters, or one parameter outside the layers), as soon as the group's gradients are
// final (LibTorch's post-accumulate-grad hooks), and the group's gradients are freed at once. The
// update of every element is the one Step makes (same kernel, same inputs), so without clipping the
// results are bit-identical. Global-norm clipping needs every gradient before the first update, so
// overlap requires grad_clip 0 (validated in spec/). The finite check becomes cumulative: a group is
// skipped when the loss or any gradient seen so far in this backward is non-finite; groups updated
// before a non-finite gradient appeared keep their update (the trainer then stops without writing
// that state).
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/spec_types.h"

namespace ftd::engine {

// Global L2 norm of `grads` (fp32 scalar tensor, on their device); `fused`: ftd's kernel.
torch::Tensor GradNorm(const std::vector<torch::Tensor>& grads, bool fused);

class AdamW {
 public:
  // fused: one multi-tensor kernel of ftd's (kernels/adamw.cu) with the clipping folded in, instead
  // of LibTorch's _fused_adamw_ and a separate scaling pass.
  AdamW(const std::vector<std::pair<std::string, torch::Tensor>>& params, const OptimizerConfig& cfg,
        bool fp32_master, bool fused = false);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // Global L2 norm of the gradients (fp32 scalar tensor, on the device). Call after backward.
  torch::Tensor GradNorm();
  // Scales every gradient by min(1, max_norm / (norm + 1e-6)), as clip_grad_norm_ does.
  void Clip(const torch::Tensor& norm, double max_norm);
  // found_inf: a fp32 scalar on the device; where it is non-zero the kernel leaves parameters and
  // moments untouched and the step count is not advanced (the GradScaler mechanism), so a
  // non-finite step is skipped without a host synchronisation.
  void Step(double lr, const torch::Tensor& found_inf);
  void ZeroGrad();

  // Overlap. EnableOverlap installs the hooks (once). BeginOverlap arms them for the backward about to
  // run (the step's last micro-batch; earlier ones accumulate as usual): lr for every group, loss the
  // step's loss (fp32 scalar on the device, for the finite check). EndOverlap, after that backward,
  // updates any group whose hooks did not all fire, disarms, and returns the global L2 norm of the
  // step's gradients (fp32 scalar on the device; non-finite where a gradient was).
  void EnableOverlap();
  void BeginOverlap(double lr, const torch::Tensor& loss);
  torch::Tensor EndOverlap();

  // State under fixed names: "exp_avg.<param>", "exp_avg_sq.<param>", "master.<param>",
  // "step.<param>" (step counts are fp32 scalars, as torch.optim keeps them).
  std::vector<std::pair<std::string, torch::Tensor>> State() const;
  // Restores State(); every name must be present with the same shape.
  template <typename Lookup>  // Lookup: (const std::string&) -> absl::StatusOr<torch::Tensor>
  absl::Status LoadState(Lookup&& lookup);

 private:
  struct Slot {
    std::string name;
    torch::Tensor param, master, exp_avg, exp_avg_sq, step, grad32;
    bool decay = true;
  };
  struct GradReadyHook;
  // The overlap's groups and the state of the backward it is armed for.
  struct Overlap {
    std::vector<size_t> group_of;             // slot -> group
    std::vector<std::vector<size_t>> groups;  // slots, in slot order
    std::vector<size_t> pending;              // per group: hooks yet to fire in this backward
    std::vector<bool> applied;                // per group: updated in this backward
    bool armed = false;
    double lr = 0;
    torch::Tensor loss;   // the step's loss (fp32)
    torch::Tensor sumsq;  // sum of the updated groups' squared gradient norms (fp64)
  };
  torch::Tensor& Grad(Slot& s);
  std::vector<torch::Tensor> Grads();
  // The AdamW update of the given slots (the step count already advanced where it is shared).
  void Update(const std::vector<size_t>& which, double lr, const torch::Tensor& found_inf);
  void GradReady(size_t slot);
  void UpdateGroup(size_t group);
  OptimizerConfig cfg_;
  bool master_;
  bool fused_;
  std::vector<Slot> slots_;
  torch::Tensor step_;       // fused: the one step count every slot's `step` aliases
  torch::Tensor clip_coef_;  // fused: the pending clip coefficient, applied inside the step
  std::vector<size_t> all_;  // every slot
  Overlap ov_;
  bool hooks_ = false;  // EnableOverlap ran
};

template <typename Lookup>
absl::Status AdamW::LoadState(Lookup&& lookup) {
  torch::NoGradGuard no_grad;
  for (auto& s : slots_) {
    std::vector<std::pair<std::string, torch::Tensor*>> want = {
        {"exp_avg." + s.name, &s.exp_avg}, {"exp_avg_sq." + s.name, &s.exp_avg_sq}, {"step." + s.name, &s.step}};
    if (master_) want.push_back({"master." + s.name, &s.master});
    for (auto& [key, dst] : want) {
      absl::StatusOr<torch::Tensor> t = lookup(key);
      if (!t.ok()) return t.status();
      if (t->sizes() != dst->sizes()) {
        return absl::DataLossError("optimizer state \"" + key + "\" has the wrong shape");
      }
      dst->copy_(*t);
    }
  }
  return absl::OkStatus();
}

}  // namespace ftd::engine

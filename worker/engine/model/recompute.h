// Activation checkpointing (spec.activation_checkpointing): trading recomputation in backward for
// activations not kept between forward and backward. Internal to the engine (LibTorch).
//
//   full:      Checkpointed(x, params, fn) runs fn(x) without recording a graph and keeps only x;
//              backward reruns fn on x with the graph recorded and differentiates it (as
//              torch.utils.checkpoint does), with the RNG state of the forward restored when asked.
//   selective: RecomputeInBackward(t, consumers, fn) frees t's storage once its consumers' forward has
//              run (they saved t itself, for their backward) and refills it from fn() when the first
//              consumer's backward is about to run. For cheap producers (RMSNorm, SwiGLU) whose inputs
//              are saved anyway.
// Both recompute with the same ops on the same inputs, so the values, and with them the losses and
// gradients, are those of a run that keeps everything.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace ftd::engine {

// fn(x) whose backward recomputes fn. `params`: the tensors fn reads that need gradients (besides
// x); their gradients come back through this function's node. `preserve_rng`: fn draws random
// numbers (dropout) on x's device; the recomputation draws the same ones.
torch::Tensor Checkpointed(const torch::Tensor& x, const std::vector<torch::Tensor>& params,
                           std::function<torch::Tensor(const torch::Tensor&)> fn, bool preserve_rng);

// Frees t's storage now and refills it with recompute() (values equal to t's) just before the
// backward of the first of `consumers` (outputs of the ops that read t) that needs a gradient. Does
// nothing when grad mode is off or no consumer needs a gradient. t must not be read again in forward.
void RecomputeInBackward(const torch::Tensor& t, const std::vector<torch::Tensor>& consumers,
                         std::function<torch::Tensor()> recompute);

}  // namespace ftd::engine

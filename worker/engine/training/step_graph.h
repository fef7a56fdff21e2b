// Forward and backward of one micro-batch as one CUDA graph (spec.kernel_tuning.cuda_graphs): at small
// shapes the step is bound by kernel launches, and a graph launches the whole forward+backward at once.
// Internal to the engine (LibTorch).
//
// How: the run's work goes to one side stream (graphs cannot capture the legacy default stream). The
// first kWarmupSteps steps run eagerly there (lazy initialisations: cuBLAS handles and workspaces,
// the allocator's blocks), then one step is captured (at::cuda::CUDAGraph) with the parameters'
// gradients unset, so the captured backward allocates them in the graph's private pool, and is
// replayed. Every later step copies its batch into the graph's static inputs and replays: the same
// kernels on the same data, so the same losses and gradients as the eager step. The gradients stay in
// the pool's memory between replays; Run hands them to the parameters after each replay (the
// optimizer, the norm and the clipping run eagerly after it: the learning rate changes every step).
// Shapes are static (batch_size x seq_len); a micro-batch with several documents in a row (a
// block-diagonal mask) runs eagerly. What it does not capture is refused at validation
// (spec/train_config.cc): gradient accumulation, activation checkpointing, LoRA dropout, FP8
// matmuls, optimizer overlap, several ranks.
#pragma once

#include <torch/torch.h>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>
#include <optional>
#include <vector>

#include "worker/engine/model/model.h"

namespace ftd::engine {

class StepGraph {
 public:
  static constexpr int kWarmupSteps = 2;

  // params: the trainable parameters (their gradients are the graph's outputs).
  StepGraph(LlamaModel* model, std::vector<torch::Tensor> params);

  // The stream every step's work runs on (the caller holds a c10::cuda::CUDAStreamGuard on it for
  // the whole run).
  const c10::cuda::CUDAStream& stream() const { return stream_; }

  // One micro-batch's forward and backward: eager during warm-up and for packed rows, otherwise by
  // replaying the graph (captured on the first call after warm-up). Returns the loss (an fp32 scalar,
  // LossMean's) with the gradients in the parameters' .grad; the parameters' gradients must be unset
  // on entry.
  torch::Tensor Run(const torch::Tensor& ids, const torch::Tensor& labels, const torch::Tensor& count,
                    const PackedLayout& layout);

  bool captured() const { return graph_ != nullptr; }

 private:
  LlamaModel* model_;
  std::vector<torch::Tensor> params_;
  c10::cuda::CUDAStream stream_;
  int eager_steps_ = 0;
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  torch::Tensor ids_, labels_, count_, loss_;  // the graph's static inputs and output
  std::vector<torch::Tensor> grads_;            // the graph's static gradients, one per parameter
};

}  // namespace ftd::engine

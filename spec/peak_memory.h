// The peak device memory a training run will allocate (the caching allocator's high-water mark),
// predicted from the spec alone: the model's shape, full fine-tuning or LoRA, batch and sequence
// length, kernel set, dtype. No LibTorch; for scheduling several jobs on one GPU and for showing a
// job's footprint before it runs. Checked against measured peaks on an H100/H200 by
// bench/lora_bench.py (docs/performance.md).
//
// The model: tensors alive for the whole run (weights, trainable state) plus the larger of
//   - the end of the forward pass: every tensor the backward pass will read, layer by layer, as the
//     ops of the chosen kernel set save them (docs/kernels.md), and the loss head's buffers;
//   - the loss head's backward (eager: the fp32 log-softmax and its gradient over the vocabulary);
//   - the optimizer step: weights, AdamW moments and one gradient per trainable parameter.
#pragma once

#include <string>

#include "spec/llama_config.h"
#include "spec/train_config.h"

namespace ftd::spec {

struct PeakMemory {
  double weights = 0;      // bytes: the base (frozen with LoRA) and the adapters
  double optimizer = 0;    // AdamW moments (and fp32 master weights) of what is trained
  double gradients = 0;    // one per trainable parameter, at the optimizer step
  double activations = 0;  // saved for backward at the end of one micro-batch's forward pass
  double head = 0;         // the loss head's largest transient (logits, log-softmax, chunks)
  double other = 0;        // token ids, rotary tables, library workspaces
  double Peak() const;
  std::string ToString() const;  // "peak 28.4 GiB: weights 15.0 GiB, ..."
};

// `gpu`: the run's device is a GPU (dtype "auto" is bf16 there, fp32 on a CPU).
PeakMemory PredictPeakMemory(const LlamaConfig& model, const TrainConfig& config, bool gpu);

}  // namespace ftd::spec

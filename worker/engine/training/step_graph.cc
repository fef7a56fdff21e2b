#include "worker/engine/training/step_graph.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

namespace ftd::engine {

StepGraph::StepGraph(LlamaModel* model, std::vector<torch::Tensor> params)
    : model_(model), params_(std::move(params)), stream_(c10::cuda::getStreamFromPool(false, model->device().index())) {}

torch::Tensor StepGraph::Run(const torch::Tensor& ids, const torch::Tensor& labels, const torch::Tensor& count,
                             const PackedLayout& layout) {
  TORCH_CHECK(c10::cuda::getCurrentCUDAStream(model_->device().index()) == stream_,
              "StepGraph::Run outside its stream");
  if (layout.packed() || eager_steps_ < kWarmupSteps) {
    if (!layout.packed()) ++eager_steps_;
    auto loss = model_->LossMean(ids, labels, count, layout);
    loss.backward();
    return loss.detach();
  }
  if (!graph_) {
    for (const auto& p : params_) {
      TORCH_CHECK(!p.grad().defined(), "StepGraph: capture with gradients already set");
    }
    ids_ = ids.clone();
    labels_ = labels.clone();
    count_ = count.clone();
    // The eager steps' cached blocks go back to the device, so the graph's private pool can take them.
    c10::cuda::CUDACachingAllocator::emptyCache();
    graph_ = std::make_unique<at::cuda::CUDAGraph>();
    graph_->capture_begin();
    {
      auto loss = model_->LossMean(ids_, labels_, count_, {});
      loss.backward();
      loss_ = loss.detach();
    }
    graph_->capture_end();
    for (const auto& p : params_) grads_.push_back(p.grad());
  } else {
    torch::NoGradGuard no_grad;
    ids_.copy_(ids);
    labels_.copy_(labels);
    count_.copy_(count);
  }
  graph_->replay();  // capturing ran nothing: the first replay computes the captured step too
  for (size_t i = 0; i < params_.size(); ++i) params_[i].mutable_grad() = grads_[i];
  return loss_;
}

}  // namespace ftd::engine

#include "worker/engine/model/recompute.h"

#include <ATen/core/ivalue.h>

#include <memory>
#include <optional>
#include <utility>

namespace ftd::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the backward needs to rerun the function: the function and the RNG state it started from.
struct Recipe : torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> fn;
  std::vector<torch::Tensor> params;  // the parameters (alive for the model's life anyway)
  std::optional<at::Generator> gen;  // set when the RNG state is restored for the rerun
  torch::Tensor rng_state;
};

struct CheckpointFn : public torch::autograd::Function<CheckpointFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList params,
                               c10::intrusive_ptr<Recipe> recipe) {
    ctx->save_for_backward({x});
    ctx->saved_data["n"] = static_cast<int64_t>(params.size());
    auto y = recipe->fn(x);  // grad mode is off here: nothing inside is kept for backward
    ctx->saved_data["recipe"] = c10::IValue::make_capsule(std::move(recipe));
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto recipe = c10::static_intrusive_pointer_cast<Recipe>(ctx->saved_data["recipe"].toCapsule());
    const int64_t n = ctx->saved_data["n"].toInt();
    auto saved = ctx->get_saved_variables();
    const bool x_grad = ctx->needs_input_grad(0);
    auto x = saved[0].detach().requires_grad_(x_grad);
    torch::Tensor y;
    {
      torch::Tensor resume_state;
      if (recipe->gen) {
        resume_state = recipe->gen->get_state();
        recipe->gen->set_state(recipe->rng_state);
      }
      at::AutoGradMode grad_mode(true);
      y = recipe->fn(x);
      if (recipe->gen) recipe->gen->set_state(resume_state);
    }
    const auto& params = recipe->params;
    variable_list inputs;
    if (x_grad) inputs.push_back(x);
    for (int64_t i = 0; i < n; ++i) {
      if (ctx->needs_input_grad(static_cast<size_t>(1 + i))) inputs.push_back(params[static_cast<size_t>(i)]);
    }
    variable_list got;
    if (!inputs.empty()) {
      got = torch::autograd::grad({y}, inputs, {grads[0]}, /*retain_graph=*/false, /*create_graph=*/false,
                                  /*allow_unused=*/true);
    }
    variable_list out;
    size_t j = 0;
    out.push_back(x_grad ? got[j++] : torch::Tensor());
    for (int64_t i = 0; i < n; ++i) {
      out.push_back(ctx->needs_input_grad(static_cast<size_t>(1 + i)) ? got[j++] : torch::Tensor());
    }
    out.emplace_back();  // recipe
    return out;
  }
};

}  // namespace

torch::Tensor Checkpointed(const torch::Tensor& x, const std::vector<torch::Tensor>& params,
                           std::function<torch::Tensor(const torch::Tensor&)> fn, bool preserve_rng) {
  auto recipe = c10::make_intrusive<Recipe>();
  recipe->fn = std::move(fn);
  recipe->params = params;
  if (preserve_rng) {
    recipe->gen = at::globalContext().defaultGenerator(x.device());
    recipe->rng_state = recipe->gen->get_state();
  }
  return CheckpointFn::apply(x, at::TensorList(params), std::move(recipe));
}

void RecomputeInBackward(const torch::Tensor& t, const std::vector<torch::Tensor>& consumers,
                         std::function<torch::Tensor()> recompute) {
  if (!at::GradMode::is_enabled()) return;
  std::vector<torch::Tensor> hooked;
  for (const auto& c : consumers) {
    if (c.requires_grad()) hooked.push_back(c);
  }
  if (hooked.empty()) return;
  struct State {
    c10::Storage storage;
    size_t nbytes = 0;
    torch::Tensor view;  // t's sizes and strides on the storage, with a version counter of its own
    std::function<torch::Tensor()> recompute;
  };
  auto state = std::make_shared<State>();
  state->storage = t.storage();
  state->nbytes = state->storage.nbytes();
  state->view = torch::empty({0}, t.options());
  {
    at::NoGradGuard no_grad;
    state->view.set_(state->storage, t.storage_offset(), t.sizes(), t.strides());
  }
  state->recompute = std::move(recompute);
  // Free: the consumers' saved references stay valid tensors whose storage is empty until refilled.
  c10::StorageImpl* impl = state->storage.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  impl->set_nbytes(0);
  for (auto& c : hooked) {
    c.register_hook([state](const torch::Tensor& grad) {
      if (state->recompute) {
        at::NoGradGuard no_grad;
        auto values = state->recompute();
        c10::StorageImpl* si = state->storage.unsafeGetStorageImpl();
        si->set_data_ptr_noswap(si->allocator()->allocate(state->nbytes));
        si->set_nbytes(state->nbytes);
        state->view.copy_(values);
        state->recompute = nullptr;  // releases what it read
      }
      return grad;
    });
  }
}

}  // namespace ftd::engine

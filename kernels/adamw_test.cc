// GPU test of the production AdamW step and multi-tensor sum of squares against the float64 reference
// (kernels/adamw_ref.h), applied to the quantized inputs (the stored parameter, gradient and moments, the
// fp32 hyperparameters). Fresh random inputs every run.
//
// Parameters and moments are updated in place: each starts from known random values and the test checks
// the update. With fp32 master weights the param is written only (param = round(master)), so it is
// poisoned (NaN) before the launch.
//
// Tolerances (MaxRelError: max |got - want| / max |want|):
//   fp32 stores 1e-5: a dozen fp32 operations per element plus the bias corrections computed on the
//     device through expm1/log1p (a few ulps), ~1e-6. For fp32 weights the update itself
//     (w_new - w_old, ~lr) is also checked at 1e-5 of its maximum, far tighter than the weights.
//   bf16 stores 2^-8: each is rounded once (2^-9 relative to itself); the fp32 error before the rounding
//     can at most move it to the neighbouring bf16 value.
//   sum of squares 1e-5: fp32 partial sums of <= 65536 squares (8 running sums per thread, then a tree),
//     then float64.
//
// Coverage: all 8 (param, grad, moment) dtype combinations; sizes 1, 7, 8, 4097, 32768 (one block),
// 65541 (3 blocks, ragged last), 100003; aligned tensors (vector path plus the n % 8 tail) and tensors
// offset by one element (scalar path); master weights on and off; per-tensor weight decay; grad_scale
// given and null; found_inf = 1 (nothing written, bitwise), 0 and null; 700 tensors (3 launches of <= 320);
// empty tensors with null pointers among them.
#include "kernels/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/adamw_ref.h"
#include "kernels/test_util.h"

namespace ftd::kernels {
namespace {

using namespace testing;  // kernels/test_util.h

std::vector<double> Minus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

struct Spec {
  int64_t numel;
  size_t offset = 0;  // 1: every buffer of the tensor unaligned
  bool master = false;
  float weight_decay = 0.1f;
};

struct Dtypes {
  DType param, grad, moment;
};

std::string Name(const Dtypes& d) {
  return std::string("param ") + DTypeName(d.param) + " grad " + DTypeName(d.grad) + " moments " + DTypeName(d.moment) +
         SeedNote();
}

// The tensors of one step: device buffers and the quantized values they start from.
class Problem {
 public:
  Problem(const std::vector<Spec>& specs, Dtypes d, std::mt19937_64& rng) : d_(d) {
    for (const Spec& s : specs) {
      auto it = std::make_unique<Item>();
      it->spec = s;
      const size_t n = static_cast<size_t>(s.numel);
      if (n == 0) {  // an empty tensor: null pointers, skipped by the launcher
        items_.push_back(std::move(it));
        continue;
      }
      it->w0 = Quantized(RandomNormal(n, 0, 0.02, rng), s.master ? DType::kF32 : d.param);
      it->g = Quantized(RandomNormal(n, 0, 0.01, rng), d.grad);
      it->m0 = Quantized(RandomNormal(n, 0, 0.003, rng), d.moment);
      // v0 >= 1e-6, so sqrt(v) stays well above the fp32 error of m (a near-zero v would let the error of a
      // cancelling m / sqrt(v) dominate the update; real second moments are not independent of the first).
      it->v0 = RandomNormal(n, 0, 0.003, rng);
      for (auto& x : it->v0) x = Quantize((std::fabs(x) + 1e-3) * (std::fabs(x) + 1e-3), d.moment);
      it->param = std::make_unique<Tensor>(n, d.param, s.offset);
      it->grad = std::make_unique<Tensor>(n, d.grad, s.offset);
      it->m = std::make_unique<Tensor>(n, d.moment, s.offset);
      it->v = std::make_unique<Tensor>(n, d.moment, s.offset);
      it->grad->Upload(it->g);
      it->m->Upload(it->m0);
      it->v->Upload(it->v0);
      if (s.master) {
        it->master = std::make_unique<Tensor>(n, DType::kF32, s.offset);
        it->master->Upload(it->w0);
        it->param->Poison();  // written only
      } else {
        it->param->Upload(it->w0);
      }
      items_.push_back(std::move(it));
    }
  }

  std::vector<AdamWTensor> Descriptors() const {
    std::vector<AdamWTensor> out;
    for (const auto& it : items_) {
      AdamWTensor t{};
      t.numel = it->spec.numel;
      t.weight_decay = it->spec.weight_decay;
      if (it->spec.numel > 0) {
        t.param = it->param->get();
        t.master = it->master ? static_cast<float*>(it->master->get()) : nullptr;
        t.grad = it->grad->get();
        t.exp_avg = it->m->get();
        t.exp_avg_sq = it->v->get();
      }
      out.push_back(t);
    }
    return out;
  }

  // Every buffer's current contents, for bitwise comparison.
  std::vector<std::vector<double>> Snapshot() const {
    std::vector<std::vector<double>> out;
    for (const auto& it : items_) {
      if (it->spec.numel == 0) continue;
      for (const Tensor* t : {it->param.get(), it->master.get(), it->grad.get(), it->m.get(), it->v.get()}) {
        if (t != nullptr) out.push_back(t->Download());
      }
    }
    return out;
  }

  // Compares every tensor with one reference step from the starting values. Errors are measured over all
  // tensors of the step together (MaxRelError's scale is the largest value of the whole step): a tensor of
  // one or a few elements can cancel to near zero (m = b1 m + (1 - b1) g, w - update), where an error
  // relative to its own size would measure the fp32 rounding of the inputs, not the kernel. A tensor left
  // unwritten (NaN) or not updated still shows, as an error the size of the update (~lr) against values
  // of ~0.05; the message names the tensor holding the worst element.
  void Expect(ref::AdamWHyper h, const std::string& what) const {
    struct Quantity {
      Quantity(const char* n, double t) : name(n), tol(t) {}
      const char* name;
      double tol;
      std::vector<double> got, want;
      std::vector<size_t> owner;  // tensor index of each element
      void Add(const std::vector<double>& g, const std::vector<double>& w, size_t i) {
        got.insert(got.end(), g.begin(), g.end());
        want.insert(want.end(), w.begin(), w.end());
        owner.insert(owner.end(), g.size(), i);
      }
    };
    Quantity master{"master", 1e-5}, master_update{"master update", 1e-5}, param{"param", Tol(d_.param)},
        param_update{"fp32 param update", 1e-5}, exp_avg{"exp_avg", Tol(d_.moment)},
        exp_avg_sq{"exp_avg_sq", Tol(d_.moment)};
    for (size_t i = 0; i < items_.size(); ++i) {
      const Item& it = *items_[i];
      if (it.spec.numel == 0) continue;
      h.weight_decay = it.spec.weight_decay;
      auto w = it.w0, m = it.m0, v = it.v0;
      ref::AdamWStep(&w, it.g, &m, &v, h);
      if (it.spec.master) {
        const auto got = it.master->Download();
        master.Add(got, w, i);
        master_update.Add(Minus(got, it.w0), Minus(w, it.w0), i);
      }
      const auto got_p = it.param->Download();
      param.Add(got_p, w, i);
      if (!it.spec.master && d_.param == DType::kF32) param_update.Add(Minus(got_p, it.w0), Minus(w, it.w0), i);
      exp_avg.Add(it.m->Download(), m, i);
      exp_avg_sq.Add(it.v->Download(), v, i);
      EXPECT_EQ(it.grad->Download(), it.g) << "grad must not change, tensor " << i << ", " << what << ", " << Name(d_);
    }
    for (const Quantity* q : {&master, &master_update, &param, &param_update, &exp_avg, &exp_avg_sq}) {
      if (q->got.empty()) continue;
      size_t worst = 0;
      double worst_err = -1;
      for (size_t e = 0; e < q->got.size(); ++e) {
        const double err = std::isfinite(q->got[e]) ? std::fabs(q->got[e] - q->want[e]) : INFINITY;
        if (err > worst_err) {
          worst_err = err;
          worst = e;
        }
      }
      const Item& it = *items_[q->owner[worst]];
      EXPECT_LE(MaxRelError(q->got, q->want), q->tol)
          << q->name << ", " << what << ", worst element in tensor " << q->owner[worst] << " (numel " << it.spec.numel
          << (it.spec.offset ? ", unaligned" : "") << (it.spec.master ? ", master" : "") << "): got " << q->got[worst]
          << " want " << q->want[worst] << ", " << Name(d_);
    }
  }

 private:
  struct Item {
    Spec spec;
    std::unique_ptr<Tensor> param, master, grad, m, v;
    std::vector<double> w0, g, m0, v0;
  };
  Dtypes d_;
  std::vector<std::unique_ptr<Item>> items_;
};

constexpr float kLr = 1e-2f, kBeta1 = 0.9f, kBeta2 = 0.95f, kEps = 1e-8f;

ref::AdamWHyper Hyper(float step, float scale) {
  ref::AdamWHyper h;
  h.lr = kLr;
  h.beta1 = kBeta1;
  h.beta2 = kBeta2;
  h.eps = kEps;
  h.step = step;
  h.grad_scale = scale;
  return h;
}

AdamWParams Params(Dtypes d) { return AdamWParams{kLr, kBeta1, kBeta2, kEps, d.param, d.grad, d.moment}; }

DeviceBuffer Scalar(double v) {
  DeviceBuffer b(1, DType::kF32);
  b.Upload({v});
  return b;
}

std::vector<Dtypes> AllDtypes() {
  std::vector<Dtypes> out;
  for (DType p : {DType::kF32, DType::kBF16}) {
    for (DType g : {DType::kF32, DType::kBF16}) {
      for (DType m : {DType::kF32, DType::kBF16}) out.push_back({p, g, m});
    }
  }
  return out;
}

const std::vector<Spec>& MixedSpecs() {
  static const std::vector<Spec> specs = {{1},
                                          {7, 0, false, 0.f},
                                          {8},
                                          {4097},
                                          {32768, 0, true},
                                          {65541},
                                          {100003, 0, true, 0.f},
                                          {0},
                                          {4097, 1},
                                          {65541, 1, true},
                                          {7, 1, false, 0.f},
                                          {1, 0, true}};
  return specs;
}

TEST(AdamWGpu, StepMatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(TestSeed());
  for (const Dtypes& d : AllDtypes()) {
    for (bool scaled : {false, true}) {
      Problem prob(MixedSpecs(), d, rng);
      const float step = 3.f, scale = 0.5f;
      DeviceBuffer step_b = Scalar(step), scale_b = Scalar(scale);
      const auto desc = prob.Descriptors();
      ASSERT_EQ(cudaSuccess, AdamWStep(desc.data(), static_cast<int>(desc.size()), Params(d), step_b.as<float>(),
                                       scaled ? scale_b.as<float>() : nullptr, nullptr, nullptr))
          << Name(d);
      Check(cudaDeviceSynchronize(), "adamw");
      prob.Expect(Hyper(step, scaled ? scale : 1.f), scaled ? "grad_scale 0.5" : "no grad_scale");
    }
  }
}

// found_inf != 0 skips the step: not one byte changes. found_inf == 0 runs it.
TEST(AdamWGpu, FoundInfSkipsTheStep) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(TestSeed());
  for (const Dtypes& d :
       {Dtypes{DType::kBF16, DType::kBF16, DType::kBF16}, Dtypes{DType::kBF16, DType::kF32, DType::kF32}}) {
    Problem prob(MixedSpecs(), d, rng);
    DeviceBuffer step_b = Scalar(1.0), inf_b = Scalar(1.0), zero_b = Scalar(0.0);
    const auto desc = prob.Descriptors();
    const auto before = prob.Snapshot();
    ASSERT_EQ(cudaSuccess, AdamWStep(desc.data(), static_cast<int>(desc.size()), Params(d), step_b.as<float>(), nullptr,
                                     inf_b.as<float>(), nullptr));
    Check(cudaDeviceSynchronize(), "adamw");
    const auto after = prob.Snapshot();
    for (size_t i = 0; i < before.size(); ++i) {
      // NaN-poisoned params (master tensors) compare unequal to themselves: compare bit patterns.
      ASSERT_EQ(before[i].size(), after[i].size());
      EXPECT_EQ(0, std::memcmp(before[i].data(), after[i].data(), before[i].size() * sizeof(double)))
          << "buffer " << i << " changed under found_inf, " << Name(d);
    }
    ASSERT_EQ(cudaSuccess, AdamWStep(desc.data(), static_cast<int>(desc.size()), Params(d), step_b.as<float>(), nullptr,
                                     zero_b.as<float>(), nullptr));
    Check(cudaDeviceSynchronize(), "adamw");
    prob.Expect(Hyper(1.f, 1.f), "found_inf 0");
  }
}

// More tensors than one launch holds (320): every one of them is updated.
TEST(AdamWGpu, ManyTensorsTakeSeveralLaunches) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(TestSeed());
  std::vector<Spec> specs;
  for (int i = 0; i < 700; ++i) {
    specs.push_back(Spec{1 + (i * 37) % 50, static_cast<size_t>(i % 3 == 0), i % 5 == 0, i % 2 ? 0.1f : 0.f});
  }
  specs.push_back(Spec{40000});
  for (const Dtypes& d :
       {Dtypes{DType::kBF16, DType::kBF16, DType::kF32}, Dtypes{DType::kF32, DType::kF32, DType::kF32}}) {
    Problem prob(specs, d, rng);
    DeviceBuffer step_b = Scalar(7.0);
    const auto desc = prob.Descriptors();
    ASSERT_EQ(cudaSuccess, AdamWStep(desc.data(), static_cast<int>(desc.size()), Params(d), step_b.as<float>(), nullptr,
                                     nullptr, nullptr));
    Check(cudaDeviceSynchronize(), "adamw");
    prob.Expect(Hyper(7.f, 1.f), "700 tensors");
  }
}

TEST(AdamWGpu, RejectsInvalidArguments) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  DeviceBuffer buf(16, DType::kF32), step_b = Scalar(1.0);
  AdamWTensor t{buf.get(), nullptr, buf.get(), buf.get(), buf.get(), 16, 0.f};
  const AdamWParams p = Params({DType::kF32, DType::kF32, DType::kF32});
  EXPECT_EQ(cudaErrorInvalidValue, AdamWStep(&t, 1, p, nullptr, nullptr, nullptr, nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, AdamWStep(&t, -1, p, step_b.as<float>(), nullptr, nullptr, nullptr));
  t.grad = nullptr;
  EXPECT_EQ(cudaErrorInvalidValue, AdamWStep(&t, 1, p, step_b.as<float>(), nullptr, nullptr, nullptr));
  t.numel = -1;
  EXPECT_EQ(cudaErrorInvalidValue, AdamWStep(&t, 1, p, step_b.as<float>(), nullptr, nullptr, nullptr));
  EXPECT_EQ(cudaSuccess, AdamWStep(nullptr, 0, p, step_b.as<float>(), nullptr, nullptr, nullptr));
}

// ---------------------------------------------------------------------------------------------------

TEST(AdamWGpu, SumSquaresMatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(TestSeed());
  struct G {
    int64_t numel;
    size_t offset;
  };
  std::vector<G> shapes = {{1, 0},      {7, 0}, {8, 0},    {4097, 0},  {65536, 0}, {65541, 0},
                           {300001, 0}, {0, 0}, {4097, 1}, {65541, 1}, {9, 1}};
  for (int i = 0; i < 700; ++i) shapes.push_back({1 + (i * 53) % 100, static_cast<size_t>(i % 2)});
  for (DType t : {DType::kF32, DType::kBF16}) {
    std::vector<std::unique_ptr<Tensor>> bufs;
    std::vector<std::vector<double>> values;
    std::vector<const void*> ptrs;
    std::vector<int64_t> numels;
    for (const G& s : shapes) {
      values.push_back(Quantized(RandomNormal(static_cast<size_t>(s.numel), 0, 0.3, rng), t));
      bufs.push_back(std::make_unique<Tensor>(static_cast<size_t>(s.numel), t, s.offset));
      if (s.numel > 0) bufs.back()->Upload(values.back());
      ptrs.push_back(s.numel > 0 ? bufs.back()->get() : nullptr);
      numels.push_back(s.numel);
    }
    const double want = ref::SumSquares(values);
    const int n = static_cast<int>(shapes.size());
    const size_t ws_bytes = MultiTensorSumSquaresWorkspaceBytes(numels.data(), n);
    DeviceBuffer ws(ws_bytes / sizeof(float), DType::kF32), out(1, DType::kF32);
    std::vector<double> first;
    for (int run = 0; run < 2; ++run) {
      ws.Poison();
      out.Poison();
      ASSERT_EQ(cudaSuccess,
                MultiTensorSumSquares(ptrs.data(), numels.data(), n, t, out.as<float>(), ws.get(), ws_bytes, nullptr))
          << DTypeName(t);
      Check(cudaDeviceSynchronize(), "sum of squares");
      const auto got = out.Download();
      EXPECT_LE(MaxRelError(got, {want}), 1e-5) << DTypeName(t) << SeedNote();
      if (run == 0) {
        first = got;
      } else {
        EXPECT_EQ(first, got) << "not deterministic, " << DTypeName(t) << SeedNote();
      }
    }
    EXPECT_EQ(cudaErrorInvalidValue, MultiTensorSumSquares(ptrs.data(), numels.data(), n, t, out.as<float>(), ws.get(),
                                                           ws_bytes - 4, nullptr));
  }
}

TEST(AdamWGpu, SumSquaresOfNothingIsZero) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  DeviceBuffer out(1, DType::kF32);
  out.Poison();
  const int64_t numel = 0;
  const void* ptr = nullptr;
  EXPECT_EQ(0u, MultiTensorSumSquaresWorkspaceBytes(&numel, 1));
  ASSERT_EQ(cudaSuccess, MultiTensorSumSquares(&ptr, &numel, 1, DType::kBF16, out.as<float>(), nullptr, 0, nullptr));
  Check(cudaDeviceSynchronize(), "sum of squares");
  EXPECT_EQ(0.0, out.Download()[0]);
}

}  // namespace
}  // namespace ftd::kernels

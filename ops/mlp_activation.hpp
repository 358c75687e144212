// The activations of layernorm_mlp as vectorized row kernels for the CPU (Eigen arrays in C = compute_t<T>): the
// functions of ops/activation_arrays.hpp, the gates of the gated variants, and the dispatch over their forms.
// Internal: included by ops/layernorm_mlp.cpp only.
//
// An activation is a function `fn` of z₀ and, for gated ones, a gate of z₁: a = fn(z₀) · gate(z₁). Each part
// gives its value and, when asked, its derivative in one pass, so the backward gets a, ∂a/∂z₀ and ∂a/∂z₁ from one
// evaluation of tanh or the sigmoid. Derivatives of clamps are 1 on the closed interval, as torch.clamp's.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <type_traits>

#include "tapegrad/ops/activation_arrays.hpp"  // ReluFn, SwishFn, GeluTanhFn, SigmoidFn, SquaredReluFn
#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/core/mlp_activation.hpp"

namespace tapegrad::detail {

template <class C> using Row = Eigen::Array<C, Eigen::Dynamic, 1>;

// GPT-OSS's activated half: swish with slope alpha of min(x, limit).
struct ClampedSwishFn {
  double alpha, limit;
  template <class C> void operator()(const Row<C>& x, Row<C>& value, std::type_identity_t<Row<C>>* grad) const {
    SwishFn{alpha}(x.min(C(limit)), value, grad);
    if (grad) *grad *= (x <= C(limit)).template cast<C>();
  }
};

// The gate of a non-gated activation: there is no z₁.
struct NoGate {};

struct LinearGate {
  template <class C> void operator()(const Row<C>& x, Row<C>& value, std::type_identity_t<Row<C>>* grad) const {
    value = x;
    if (grad) grad->setOnes(x.size());
  }
};

// GPT-OSS's linear half: clamp(x, -limit, limit) + 1.
struct ClampedLinearGate {
  double limit;
  template <class C> void operator()(const Row<C>& x, Row<C>& value, std::type_identity_t<Row<C>>* grad) const {
    value = x.max(C(-limit)).min(C(limit)) + C(1);
    if (grad) *grad = (x.abs() <= C(limit)).template cast<C>();
  }
};

// Calls body(fn, gate) with the compile-time functor of `form`'s function and of its gate (the clamped function
// comes with the clamped gate only: the other pairs are never made).
template <class Body> decltype(auto) with_activation(const MlpActivation& form, Body&& body) {
  auto with_gate = [&](const auto& fn) -> decltype(body(ReluFn{}, NoGate{})) {
    constexpr bool clamped = std::is_same_v<std::decay_t<decltype(fn)>, ClampedSwishFn>;
    if constexpr (clamped) {
      if (form.gate == MlpGate::clamped_linear) return body(fn, ClampedLinearGate{form.limit});
    } else {
      if (form.gate == MlpGate::none) return body(fn, NoGate{});
      if (form.gate == MlpGate::linear) return body(fn, LinearGate{});
    }
    throw Error("layernorm_mlp: no activation has this function and gate");
  };
  switch (form.fn) {
    case MlpFunction::relu: return with_gate(ReluFn{});
    case MlpFunction::gelu_tanh: return with_gate(GeluTanhFn{});
    case MlpFunction::swish: return with_gate(SwishFn{form.alpha});
    case MlpFunction::squared_relu: return with_gate(SquaredReluFn{});
    case MlpFunction::sigmoid: return with_gate(SigmoidFn{});
    case MlpFunction::clamped_swish: return with_gate(ClampedSwishFn{form.alpha, form.limit});
  }
  throw Error("layernorm_mlp: unknown activation function");
}

}  // namespace tapegrad::detail

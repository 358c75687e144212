// The activations of layernorm_mlp as vectorized row kernels for the CPU (Eigen arrays in C = compute_t<T>): the
// functions of ops/detail/activation_arrays.hpp, the gates of the gated variants, and the dispatch over their forms.
// Internal to ops/layernorm_mlp/ (cpu_steps.cpp).
//
// An activation is a function `fn` of z₀ and, for gated ones, a gate of z₁: a = fn(z₀) · gate(z₁). Each part
// gives its value and, when asked, its derivative in one pass, so the backward gets a, ∂a/∂z₀ and ∂a/∂z₁ from one
// evaluation of tanh or the sigmoid. Derivatives of clamps are 1 on the closed interval, as torch.clamp's.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <type_traits>

#include "tapegrad/ops/detail/activation_arrays.hpp"  // ReluFn, SwishFn, GeluTanhFn, SigmoidFn, SquaredReluFn
#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/cuda/activation_form.hpp"

namespace tapegrad::detail::mlp {

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
template <class Body> decltype(auto) with_activation(const ActivationForm& form, Body&& body) {
  auto with_gate = [&](const auto& fn) -> decltype(body(ReluFn{}, NoGate{})) {
    constexpr bool clamped = std::is_same_v<std::decay_t<decltype(fn)>, ClampedSwishFn>;
    if constexpr (clamped) {
      if (form.gate == ActivationGate::clamped_linear) return body(fn, ClampedLinearGate{form.limit});
    } else {
      if (form.gate == ActivationGate::none) return body(fn, NoGate{});
      if (form.gate == ActivationGate::linear) return body(fn, LinearGate{});
    }
    throw Error("layernorm_mlp: no activation has this function and gate");
  };
  switch (form.fn) {
    case ActivationFunction::relu: return with_gate(ReluFn{});
    case ActivationFunction::gelu_tanh: return with_gate(GeluTanhFn{});
    case ActivationFunction::swish: return with_gate(SwishFn{form.alpha});
    case ActivationFunction::squared_relu: return with_gate(SquaredReluFn{});
    case ActivationFunction::sigmoid: return with_gate(SigmoidFn{});
    case ActivationFunction::clamped_swish: return with_gate(ClampedSwishFn{form.alpha, form.limit});
  }
  throw Error("layernorm_mlp: unknown activation function");
}

}  // namespace tapegrad::detail::mlp

// The activations of layernorm_mlp as vectorized row kernels for the CPU (Eigen arrays in C = compute_t<T>): the
// functions of ops/activation_arrays.hpp, the gates of the gated variants, and the dispatch over Activation.
// Internal: included by ops/layernorm_mlp.cpp only.
//
// An activation is a function `fn` of z₀ and, for gated ones, a gate of z₁: a = fn(z₀) · gate(z₁). Each part
// gives its value and, when asked, its derivative in one pass, so the backward gets a, ∂a/∂z₀ and ∂a/∂z₁ from one
// evaluation of tanh or the sigmoid. Derivatives of clamps are 1 on the closed interval, as torch.clamp's.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <type_traits>

#include "ops/activation_arrays.hpp"  // ReluFn, SwishFn, GeluTanhFn, SigmoidFn, SquaredReluFn
#include "ops/layernorm_mlp.hpp"

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

// Calls body(fn, gate) with the compile-time parts of `activation`.
template <class Body> decltype(auto) with_activation(const LayerNormMLPOptions& options, Body&& body) {
  const ClampedSwigluParams& clamp = options.clamped_swiglu;
  switch (options.activation) {
    case Activation::relu: return body(ReluFn{}, NoGate{});
    case Activation::gelu: return body(GeluTanhFn{}, NoGate{});
    case Activation::silu: return body(SwishFn{1.0}, NoGate{});
    case Activation::quick_gelu: return body(SwishFn{activation::quick_gelu_alpha}, NoGate{});
    case Activation::squared_relu: return body(SquaredReluFn{}, NoGate{});
    case Activation::reglu: return body(ReluFn{}, LinearGate{});
    case Activation::geglu: return body(GeluTanhFn{}, LinearGate{});
    case Activation::swiglu: return body(SwishFn{1.0}, LinearGate{});
    case Activation::glu: return body(SigmoidFn{}, LinearGate{});
    case Activation::qgeglu: return body(SwishFn{activation::quick_gelu_alpha}, LinearGate{});
    case Activation::sreglu: return body(SquaredReluFn{}, LinearGate{});
    case Activation::clamped_swiglu:
      return body(ClampedSwishFn{clamp.alpha, clamp.limit}, ClampedLinearGate{clamp.limit});
  }
  throw Error("layernorm_mlp: unknown activation");
}

}  // namespace tapegrad::detail

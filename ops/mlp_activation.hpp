// The activations of layernorm_mlp as vectorized row kernels for the CPU (Eigen arrays in C = compute_t<T>).
// Internal: included by ops/layernorm_mlp.cpp only.
//
// An activation is a function `fn` of z₀ and, for gated ones, a gate of z₁: a = fn(z₀) · gate(z₁). Each part
// gives its value and, when asked, its derivative in one pass, so the backward gets a, ∂a/∂z₀ and ∂a/∂z₁ from one
// evaluation of tanh or the sigmoid. Derivatives of clamps are 1 on the closed interval, as torch.clamp's.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <type_traits>

#include "ops/activation_math.hpp"
#include "ops/layernorm_mlp.hpp"

namespace tapegrad::detail {

template <class C> using Row = Eigen::Array<C, Eigen::Dynamic, 1>;

struct ReluFn {
  template <class C> void operator()(const Row<C>& x, Row<C>& value, std::type_identity_t<Row<C>>* grad) const {
    value = x.max(C(0));
    if (grad) *grad = (x > C(0)).template cast<C>();
  }
};

// σ(x) = 1 / (1 + exp(-x)) with Eigen's vectorized exp, for f32 and f64 alike (its tanh and logistic are only
// vectorized for f32).
template <class C, class A> Row<C> sigmoid_of(const A& x) { return (C(1) + (-x).exp()).inverse(); }

// The tanh form 0.5·x·(1 + tanh(u)), u = √(2/π)·(x + 0.044715·x³), computed as x·σ(2u).
struct GeluTanhFn {
  template <class C> void operator()(const Row<C>& x, Row<C>& value, std::type_identity_t<Row<C>>* grad) const {
    const C k0 = C(activation::sqrt_2_over_pi), k1 = C(activation::gelu_tanh_cubic);
    const Row<C> s = sigmoid_of<C>(C(2) * k0 * (x + k1 * x.cube()));
    value = x * s;
    // Once σ saturates, σ(1-σ) is 0 while x·(1 + 3k₁x²) may overflow: 0·inf would be NaN.
    if (grad) {
      const Row<C> slope = s * (C(1) - s);
      *grad = s + (slope > C(0)).select(C(2) * k0 * x * slope * (C(1) + C(3) * k1 * x * x), C(0));
    }
  }
};

// x·σ(alpha·x): silu for alpha = 1, quick_gelu for alpha = 1.702.
struct SwishFn {
  double alpha;
  template <class C> void operator()(const Row<C>& x, Row<C>& value, std::type_identity_t<Row<C>>* grad) const {
    const C a = C(alpha);
    const Row<C> s = sigmoid_of<C>(a * x);
    value = x * s;
    if (grad) *grad = s * (C(1) + a * x * (C(1) - s));
  }
};

struct SigmoidFn {
  template <class C> void operator()(const Row<C>& x, Row<C>& value, std::type_identity_t<Row<C>>* grad) const {
    value = sigmoid_of<C>(x);
    if (grad) *grad = value * (C(1) - value);
  }
};

struct SquaredReluFn {
  template <class C> void operator()(const Row<C>& x, Row<C>& value, std::type_identity_t<Row<C>>* grad) const {
    const Row<C> r = x.max(C(0));
    value = r.square();
    if (grad) *grad = C(2) * r;
  }
};

// GPT-OSS's activated half: swish with slope alpha of min(x, limit).
struct ClampedSwishFn {
  double alpha, limit;
  template <class C> void operator()(const Row<C>& x, Row<C>& value, std::type_identity_t<Row<C>>* grad) const {
    SwishFn{alpha}(Row<C>(x.min(C(limit))), value, grad);
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

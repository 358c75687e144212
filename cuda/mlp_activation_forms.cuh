// The activation of layernorm_mlp's kernels per element (cuda/mlp_activation.cu, cuda/mlp_activation_codes.cu): fn
// and its gate with their derivatives, in the compute type, from cuda/detail/activation_math.hpp. Internal to cuda/.
#pragma once

#include "tapegrad/cuda/mlp_activation.hpp"
#include "tapegrad/cuda/detail/activation_math.hpp"
#include "tapegrad/tensor/gpu/detail/launch.cuh"

namespace tapegrad::cuda::activation_forms {

namespace act = tapegrad::activation;

// What a kernel is compiled for: GELU and SwiGLU, the common ones, as fixed forms (the compiler can then interleave
// the values of a pack, where a switch per value keeps them apart), any activation through the general switch. A
// fixed form computes exactly what the switch does for it.
enum class Form { general, gelu, swiglu };

inline Form form_of(const ActivationForm& a) {
  if (a.fn == ActivationFunction::gelu_tanh && a.gate == ActivationGate::none) return Form::gelu;
  if (a.fn == ActivationFunction::swish && a.gate == ActivationGate::linear && a.alpha == 1.0) return Form::swiglu;
  return Form::general;
}

template <Form F> __device__ __forceinline__ int width_of(const ActivationForm& a) {
  if constexpr (F == Form::general) return a.width();
  else return F == Form::gelu ? 1 : 2;
}

// fn(x), and fn'(x) into *grad unless null. Clamps differentiate as torch.clamp: 1 on the closed interval. Fast:
// the sigmoids with the hardware's exp and division (for 16-bit storage; activation_math.hpp).
template <Form F, bool Fast, class C> __device__ __forceinline__ C function_of(const ActivationForm& a, C x, C* grad) {
  if constexpr (F == Form::gelu) return act::gelu_tanh<Fast>(x, grad);
  if constexpr (F == Form::swiglu) return act::swish<Fast>(x, C(1), grad);
  switch (a.fn) {
    case ActivationFunction::relu: return act::relu(x, grad);
    case ActivationFunction::gelu_tanh: return act::gelu_tanh<Fast>(x, grad);
    case ActivationFunction::swish: return act::swish<Fast>(x, C(a.alpha), grad);
    case ActivationFunction::squared_relu: return act::squared_relu(x, grad);
    case ActivationFunction::sigmoid: {
      const C s = act::sigmoid<Fast>(x);
      if (grad) *grad = s * (C(1) - s);
      return s;
    }
    default: {  // clamped_swish: swish of min(x, limit)
      const C limit = C(a.limit);
      const C value = act::swish<Fast>(x < limit ? x : limit, C(a.alpha), grad);
      if (grad && !(x <= limit)) *grad = C(0);
      return value;
    }
  }
}

template <Form F, class C> __device__ __forceinline__ C gate_of(const ActivationForm& a, C x, C* grad) {
  if (F == Form::swiglu || a.gate == ActivationGate::linear) {
    if (grad) *grad = C(1);
    return x;
  }
  const C limit = C(a.limit);  // clamped_linear: clamp(x, ±limit) + 1
  if (grad) *grad = fabs(x) <= limit ? C(1) : C(0);
  return (x < -limit ? -limit : (x > limit ? limit : x)) + C(1);
}

// One element of the backward, each result rounded to S: a = fn(z₀)·gate(z₁) (bitwise the forward's a) and
// dz₀ = da·gate·fn'(z₀), dz₁ = da·fn(z₀)·gate'(z₁) (z₁, dz₁ only for gated activations, width 2).
template <class S> struct BackwardElement {
  S a, dz0, dz1;
};
template <Form F, class S, class C>
__device__ __forceinline__ BackwardElement<S> backward_element(const ActivationForm& act, int width, C z0, C z1,
                                                               C da) {
  C grad, gate_grad;
  C value = function_of<F, sizeof(S) == 2>(act, z0, &grad);
  BackwardElement<S> out{};
  if (width == 2) {
    const C gate = gate_of<F, C>(act, z1, &gate_grad);
    out.dz0 = from_compute<S>(da * gate * grad);
    out.dz1 = from_compute<S>(da * value * gate_grad);
    value *= gate;
  } else {
    out.dz0 = from_compute<S>(da * grad);
  }
  out.a = from_compute<S>(value);
  return out;
}

}  // namespace tapegrad::cuda::activation_forms

// Scalar forms of the activations and their derivatives, for the kernels. Plain C++ (no Eigen, no CUDA types):
// usable from host code and, through TAPEGRAD_HOST_DEVICE, kernels. The CPU evaluates the same functions
// vectorized, from ops/activation_arrays.hpp, which shares the constants below.
#pragma once

#include <cmath>

#include "tensor/philox.hpp"  // TAPEGRAD_HOST_DEVICE

namespace tapegrad::activation {

inline constexpr double sqrt_2_over_pi = 0.79788456080286535588;
inline constexpr double inv_sqrt_2 = 0.70710678118654752440;
inline constexpr double inv_sqrt_2pi = 0.39894228040143267794;
inline constexpr double quick_gelu_alpha = 1.702;
inline constexpr double gelu_tanh_cubic = 0.044715;

template <class S> TAPEGRAD_HOST_DEVICE inline S sigmoid(S x) { return S(1) / (S(1) + std::exp(-x)); }

template <class S> TAPEGRAD_HOST_DEVICE inline S relu(S x) { return x > S(0) ? x : S(0); }
template <class S> TAPEGRAD_HOST_DEVICE inline S relu_grad(S x) { return x > S(0) ? S(1) : S(0); }

// x·Φ(x), Φ the standard normal CDF.
template <class S> TAPEGRAD_HOST_DEVICE inline S gelu_erf(S x) { return S(0.5) * x * (S(1) + std::erf(x * S(inv_sqrt_2))); }
template <class S> TAPEGRAD_HOST_DEVICE inline S gelu_erf_grad(S x) {
  return S(0.5) * (S(1) + std::erf(x * S(inv_sqrt_2))) + x * S(inv_sqrt_2pi) * std::exp(S(-0.5) * x * x);
}

// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), the form TransformerEngine uses.
template <class S> TAPEGRAD_HOST_DEVICE inline S gelu_tanh(S x) {
  const S t = std::tanh(S(sqrt_2_over_pi) * (x + S(gelu_tanh_cubic) * x * x * x));
  return S(0.5) * x * (S(1) + t);
}
template <class S> TAPEGRAD_HOST_DEVICE inline S gelu_tanh_grad(S x) {
  const S t = std::tanh(S(sqrt_2_over_pi) * (x + S(gelu_tanh_cubic) * x * x * x));
  const S dinner = S(sqrt_2_over_pi) * (S(1) + S(3 * gelu_tanh_cubic) * x * x);
  const S sech2 = S(1) - t * t;
  // Once tanh saturates sech² is 0, while x·dinner may overflow (in f32 beyond |x| ~ 1e13): 0·inf would be NaN.
  return S(0.5) * (S(1) + t) + (sech2 == S(0) ? S(0) : S(0.5) * x * sech2 * dinner);
}

// x·σ(x)
template <class S> TAPEGRAD_HOST_DEVICE inline S silu(S x) { return x * sigmoid(x); }
template <class S> TAPEGRAD_HOST_DEVICE inline S silu_grad(S x) {
  const S s = sigmoid(x);
  return s * (S(1) + x * (S(1) - s));
}

// x·σ(1.702·x)
template <class S> TAPEGRAD_HOST_DEVICE inline S quick_gelu(S x) { return x * sigmoid(S(quick_gelu_alpha) * x); }
template <class S> TAPEGRAD_HOST_DEVICE inline S quick_gelu_grad(S x) {
  const S s = sigmoid(S(quick_gelu_alpha) * x);
  return s + S(quick_gelu_alpha) * x * s * (S(1) - s);
}

// max(x, 0)²
template <class S> TAPEGRAD_HOST_DEVICE inline S squared_relu(S x) { return x > S(0) ? x * x : S(0); }
template <class S> TAPEGRAD_HOST_DEVICE inline S squared_relu_grad(S x) { return x > S(0) ? S(2) * x : S(0); }

}  // namespace tapegrad::activation

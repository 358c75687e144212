// Scalar forms of the activations and their derivatives, for the GPU kernels. Plain C++ (no Eigen, no CUDA types):
// usable from host code and, through TAPEGRAD_HOST_DEVICE, kernels. They are the formulas of the CPU's vectorized
// ops/detail/activation_arrays.hpp, one element at a time, with the same limits: finite or ±inf, never NaN, for every
// non-NaN x (a factor that saturates to 0 times one that grows without bound gives 0).
//
// Each `f(x, grad)` returns f(x) and, when grad is not null, stores f'(x) there.
#pragma once

#include <cmath>

#include "tapegrad/tensor/core/detail/host_device.hpp"

namespace tapegrad::activation {

inline constexpr double sqrt_2_over_pi = 0.79788456080286535588;
inline constexpr double inv_sqrt_2 = 0.70710678118654752440;
inline constexpr double inv_sqrt_2pi = 0.39894228040143267794;
inline constexpr double quick_gelu_alpha = 1.702;
inline constexpr double gelu_tanh_cubic = 0.044715;

// The smallest normal S: below it a vanishing factor counts as 0 (as the CPU's TimesVanishingOp).
template <class S> TAPEGRAD_HOST_DEVICE constexpr S smallest_normal() {
  if constexpr (sizeof(S) == 4) {
    return S(1.17549435082228750797e-38);
  } else {
    return S(2.22507385850720138309e-308);
  }
}

// a·b, but 0 where |b| is below the normal range, even for infinite a.
template <class S> TAPEGRAD_HOST_DEVICE inline S times_vanishing(S a, S b) {
  return std::fabs(b) < smallest_normal<S>() ? S(0) : a * b;
}

// Fast: in f32 on the GPU, the hardware's exp and division (a few ulp of f32 apart from the accurate ones), for
// values stored in 16 bits, whose rounding is 2^13 times coarser; the accurate form everywhere else.
template <bool Fast = false, class S> TAPEGRAD_HOST_DEVICE inline S sigmoid(S x) {
#ifdef __CUDA_ARCH__
  // __fdividef(1, y) is 0 for y beyond 2^126, where σ is below f32's normal range anyway.
  if constexpr (Fast && sizeof(S) == 4) return __fdividef(1.0f, 1.0f + __expf(-x));
#endif
  return S(1) / (S(1) + std::exp(-x));
}

template <class S> TAPEGRAD_HOST_DEVICE inline S relu(S x, S* grad) {
  if (grad) *grad = x > S(0) ? S(1) : S(0);
  return x > S(0) ? x : S(0);
}

template <class S> TAPEGRAD_HOST_DEVICE inline S squared_relu(S x, S* grad) {
  const S r = x > S(0) ? x : S(0);
  if (grad) *grad = S(2) * r;
  return r * r;
}

// x·σ(z) for z = z(x), with derivative σ(z) + x·σ(z)(1 - σ(z))·dz.
template <bool Fast = false, class S> TAPEGRAD_HOST_DEVICE inline S times_sigmoid(S x, S z, S dz, S* grad) {
  const S s = sigmoid<Fast>(z);
  if (grad) *grad = s + times_vanishing(x * dz, s * (S(1) - s));
  return times_vanishing(x, s);
}

// x·σ(alpha·x): silu for alpha = 1, quick_gelu for alpha = 1.702.
template <bool Fast = false, class S> TAPEGRAD_HOST_DEVICE inline S swish(S x, S alpha, S* grad) {
  return times_sigmoid<Fast>(x, alpha * x, alpha, grad);
}

// 0.5·x·(1 + tanh(u)), u = √(2/π)·(x + 0.044715·x³), computed as x·σ(2u).
template <bool Fast = false, class S> TAPEGRAD_HOST_DEVICE inline S gelu_tanh(S x, S* grad) {
  const S k0 = S(2 * sqrt_2_over_pi), k1 = S(gelu_tanh_cubic);
  return times_sigmoid<Fast>(x, k0 * (x + k1 * x * x * x), k0 * (S(1) + S(3) * k1 * x * x), grad);
}

// x·Φ(x), Φ the standard normal CDF; derivative Φ(x) + x·φ(x).
template <class S> TAPEGRAD_HOST_DEVICE inline S gelu_erf(S x, S* grad) {
  const S cdf = S(0.5) * (S(1) + std::erf(x * S(inv_sqrt_2)));
  if (grad) *grad = cdf + times_vanishing(x, S(inv_sqrt_2pi) * std::exp(S(-0.5) * x * x));
  return times_vanishing(x, cdf);
}

}  // namespace tapegrad::activation

// Layer normalization and RMS normalization over the last axis of x [..., H], each recorded as one tape node with
// a hand-written backward (formulas in ops/norm.cpp). Statistics are computed in compute_t<T> (f32 for bf16/f16,
// f64 for f64) and the output is rounded to T once.
//
// A layernorm without a shift is its own overload (no beta argument) rather than an undefined Var: a missing beta
// is then visible at the call site and cannot be passed by accident.
#pragma once

#include "tapegrad/autodiff/var.hpp"

namespace tapegrad {

struct NormOptions {
  double epsilon = 1e-6;             // added to the variance (rmsnorm: the mean square) under the square root; > 0
  bool zero_centered_gamma = false;  // scale by (1 + gamma), so that gamma = 0 leaves x̂ unscaled
};

// (x - mean) / sqrt(var + epsilon) * gamma + beta, over the last axis; gamma and beta have shape [H].
template <class T>
Var<T> layernorm(const Var<T>& x, const Var<T>& gamma, const Var<T>& beta, const NormOptions& options = {});
// (x - mean) / sqrt(var + epsilon) * gamma, over the last axis; gamma has shape [H].
template <class T> Var<T> layernorm(const Var<T>& x, const Var<T>& gamma, const NormOptions& options = {});
// x / sqrt(mean(x²) + epsilon) * gamma, over the last axis; gamma has shape [H].
template <class T> Var<T> rmsnorm(const Var<T>& x, const Var<T>& gamma, const NormOptions& options = {});

template <VarExpression E, class T>
auto layernorm(const E& x, const Var<T>& gamma, const Var<T>& beta, const NormOptions& options = {}) {
  return layernorm(x.evaluate(), gamma, beta, options);
}
template <VarExpression E, class T> auto layernorm(const E& x, const Var<T>& gamma, const NormOptions& options = {}) {
  return layernorm(x.evaluate(), gamma, options);
}
template <VarExpression E, class T> auto rmsnorm(const E& x, const Var<T>& gamma, const NormOptions& options = {}) {
  return rmsnorm(x.evaluate(), gamma, options);
}

}  // namespace tapegrad

// Differentiable dtype conversion: cast<To>(x) rounds each element of x to To (round-to-nearest-even) and its
// backward rounds the gradient back to x's dtype, on x's device (bitwise the same on a GPU as on the cpu).
// Mixed-precision code uses it to run f32 parameters in bf16.
// Casting to the same dtype returns x itself and records nothing.
#pragma once

#include "tapegrad/autodiff/var.hpp"

namespace tapegrad {

template <class To, class From> Var<To> cast(const Var<From>& x);

template <class To, VarExpression E> auto cast(const E& x) { return cast<To>(x.evaluate()); }

}  // namespace tapegrad

// Helpers the core tests share beyond tests/support.hpp: plain loops for writing custom ops, and the tolerance
// for results that must agree to rounding.
#pragma once

#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

namespace tapegrad::test {

// For double results computed two ways that agree up to rounding.
inline constexpr Tolerance exact{1e-12, 1e-12};

// out[i] = f(in[i]), and out[i] = f(a[i], b[i]) for tensors of one shape.
template <class F> Tensor<double> map(const Tensor<double>& in, F f) {
  Tensor<double> out(in.shape());
  for (std::int64_t i = 0; i < in.numel(); ++i) out.flat(i) = f(in.flat(i));
  return out;
}
template <class F> Tensor<double> zip(const Tensor<double>& a, const Tensor<double>& b, F f) {
  Tensor<double> out(a.shape());
  for (std::int64_t i = 0; i < a.numel(); ++i) out.flat(i) = f(a.flat(i), b.flat(i));
  return out;
}

}  // namespace tapegrad::test

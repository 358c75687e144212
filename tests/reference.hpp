// What the reduce and layout tests share: index arithmetic for naive reference implementations, and running one op
// in T and in double on the same (rounded) values.
#pragma once

#include <doctest/doctest.h>

#include <vector>

#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

namespace tapegrad::test {

// The multi-index of flat (row-major) element i of `shape`, and back.
inline std::vector<std::int64_t> unravel(std::int64_t i, const Shape& shape) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(shape.rank()));
  for (int a = shape.rank() - 1; a >= 0; --a) {
    idx[static_cast<std::size_t>(a)] = i % shape[a];
    i /= shape[a];
  }
  return idx;
}
inline std::int64_t ravel(const std::vector<std::int64_t>& idx, const Shape& shape) {
  std::int64_t i = 0;
  for (int a = 0; a < shape.rank(); ++a) i = i * shape[a] + idx[static_cast<std::size_t>(a)];
  return i;
}

// Runs `f` (a generic callable on Var) in T on a random x, and in double on the same rounded values; checks the
// forward and the gradient for a random dy against the double ones under `tol`.
template <class T, class F> void check_against_double(F f, const Shape& shape, std::uint64_t seed, Tolerance tol) {
  Tape tape;
  TapeScope scope(tape);
  auto x = param(randn<T>(shape, seed));
  auto x64 = param(cast<double>(x.value()));
  Var<T> y = f(x);
  Var<double> y64 = f(x64);
  check_close(y.value(), y64.value(), tol);
  const Tensor<T> dy = randn<T>(y.shape(), seed + 1);
  backward(y, dy);
  backward(y64, cast<double>(dy));
  check_close(x.grad(), x64.grad(), tol);
}

}  // namespace tapegrad::test

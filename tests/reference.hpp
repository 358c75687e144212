// What the reduce and layout tests share: index arithmetic for naive reference implementations, a comparison under
// a tolerance that names the worst element, and running one op in T and in double on the same (rounded) values.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tapegrad.hpp"

TYPE_TO_STRING(tapegrad::bf16);
TYPE_TO_STRING(tapegrad::f16);

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

struct Tolerance {
  double rtol, atol;
};

// Checks |got - want| <= atol + rtol·|want| elementwise (NaN matches NaN); a failure names the worst element.
template <class T> void check_close(const Tensor<T>& got, const Tensor<double>& want, Tolerance tol) {
  REQUIRE(got.shape() == want.shape());
  double worst = 0.0;
  std::int64_t at = 0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double g = convert<double>(got.flat(i)), w = want.flat(i);
    if (std::isnan(g) && std::isnan(w)) continue;
    const double diff = std::abs(g - w);
    double ratio = diff == 0.0 ? 0.0 : diff / (tol.atol + tol.rtol * std::abs(w));
    if (std::isnan(ratio)) ratio = std::numeric_limits<double>::infinity();
    if (ratio > worst) {
      worst = ratio;
      at = i;
    }
  }
  INFO("worst element ", at, " of shape ", got.shape(), ": got ", convert<double>(got.flat(at)), ", want ",
       want.flat(at), " (rtol ", tol.rtol, ", atol ", tol.atol, ")");
  CHECK(worst <= 1.0);
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

// The checks every elementwise op and activation gets, in one call per op (Stan's expect_ad style):
//   - forward in f64, f32, bf16 and f16 against a plain double reference of the same (rounded) inputs;
//   - backward in f32, bf16 and f16 against the f64 backward of the same inputs and seed;
//   - gradcheck in double.
// An op is described by a small "case" struct: its name, its input domain, `apply` on Vars and `reference` on
// doubles. Cases are listed with the UNARY_CASE / BINARY_CASE macros beside the tests.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "core_test_helpers.hpp"
#include "tapegrad/tapegrad.hpp"

namespace tapegrad::test {

// Inputs keep away from the kinks and singularities of an op: `positive` for log, sqrt, pow's base;
// `away_from_zero` (|x| >= 0.25) for abs, relu, division.
enum class Domain { any, positive, away_from_zero };

template <class T> Tensor<T> sample(const Shape& shape, std::uint64_t seed, Domain domain) {
  if (domain == Domain::positive) return rand_uniform<T>(shape, seed, 0.3, 3.0);
  Tensor<T> t = randn<T>(shape, seed, 0.0, 1.5);
  if (domain == Domain::away_from_zero) {
    for (T& v : t.span()) {
      const double d = convert<double>(v);
      v = convert<T>(d + (d < 0 ? -0.25 : 0.25));
    }
  }
  return t;
}

// Tolerances of results in T against double, from the same rounded inputs: one rounding of the output (half an
// ulp: 2^-9 for bf16, 2^-12 for f16) on top of arithmetic in f32; atol covers results near zero.
template <class T> Tolerance tolerance() {
  if constexpr (std::is_same_v<T, double>) {
    return {1e-12, 1e-13};
  } else if constexpr (std::is_same_v<T, float>) {
    return {2e-5, 1e-6};
  } else if constexpr (std::is_same_v<T, bf16>) {
    return {8e-3, 1e-3};
  } else {
    static_assert(std::is_same_v<T, f16>);
    return {1e-3, 1e-4};
  }
}

#define UNARY_CASE(NAME, DOMAIN, EXPR, REFERENCE)                        \
  struct NAME {                                                          \
    static constexpr const char* name = #EXPR;                           \
    static constexpr ::tapegrad::test::Domain domain = DOMAIN;           \
    template <class X> static auto apply(const X& x) { return EXPR; }    \
    static double reference(double x) { return REFERENCE; }              \
  };

#define BINARY_CASE(NAME, DOMAIN_X, DOMAIN_Y, EXPR, REFERENCE)                             \
  struct NAME {                                                                            \
    static constexpr const char* name = #EXPR;                                             \
    static constexpr ::tapegrad::test::Domain domain_x = DOMAIN_X, domain_y = DOMAIN_Y;    \
    template <class X, class Y> static auto apply(const X& x, const Y& y) { return EXPR; } \
    static double reference(double x, double y) { return REFERENCE; }                      \
  };

// Calls f.template operator()<Case>() for each case.
template <class... Cases, class F> void for_each_case(F&& f) { (f.template operator()<Cases>(), ...); }

// Gradients of `sum(dy · f(inputs...))` with respect to each input, on a private tape.
template <class T, class F, class... Tensors>
std::vector<Tensor<T>> gradients(F f, const Tensor<T>& dy, const Tensors&... inputs) {
  Tape tape;
  TapeScope scope(tape);
  const auto vars = std::make_tuple(param(inputs)...);
  backward(eval(std::apply(f, vars)), dy);
  return std::apply([](const auto&... v) { return std::vector<Tensor<T>>{v.grad()...}; }, vars);
}

// The full Jacobian for small outputs; random projections (fast mode) for large ones.
inline GradcheckOptions gradcheck_options(const Shape& output) { return {.fast_mode = output.numel() > 512}; }

template <class Case, class T> void check_unary(const Shape& shape, std::uint64_t seed) {
  INFO(std::string(Case::name) << " on " << shape.str());
  const Tolerance tol = tolerance<T>();
  const Tensor<T> x = sample<T>(shape, seed, Case::domain);
  const Var<T> y = eval(Case::apply(constant(x)));
  Tensor<double> expected(shape);
  for (std::int64_t i = 0; i < x.numel(); ++i) expected.flat(i) = Case::reference(convert<double>(x.flat(i)));
  check_close(y.value(), expected, tol);

  const Tensor<T> dy = randn<T>(shape, seed + 1);
  const auto f = [](const auto& v) { return Case::apply(v); };
  const Tensor<T> dx = gradients<T>(f, dy, x)[0];
  const Tensor<double> dx_double = gradients<double>(f, cast<double>(dy), cast<double>(x))[0];
  check_close(dx, dx_double, tol);

  if constexpr (std::is_same_v<T, double>) {
    CHECK(gradcheck([](const std::vector<Var<double>>& in) -> Var<double> { return Case::apply(in[0]); }, {x},
                    gradcheck_options(shape)));
  }
}

template <class Case, class T> void check_binary(const Shape& shape_x, const Shape& shape_y, std::uint64_t seed) {
  INFO(std::string(Case::name) << " on " << shape_x.str() << " and " << shape_y.str());
  const Tolerance tol = tolerance<T>();
  const Tensor<T> x = sample<T>(shape_x, seed, Case::domain_x), y = sample<T>(shape_y, seed + 1, Case::domain_y);
  const Var<T> z = eval(Case::apply(constant(x), constant(y)));
  const Shape out = broadcast_shapes(shape_x, shape_y, "test");
  REQUIRE(z.shape() == out);
  const Tensor<double> xe = expand_to(cast<double>(x), out), ye = expand_to(cast<double>(y), out);
  Tensor<double> expected(out);
  for (std::int64_t i = 0; i < out.numel(); ++i) expected.flat(i) = Case::reference(xe.flat(i), ye.flat(i));
  check_close(z.value(), expected, tol);

  const Tensor<T> dz = randn<T>(out, seed + 2);
  const auto f = [](const auto& a, const auto& b) { return Case::apply(a, b); };
  const auto grads = gradients<T>(f, dz, x, y);
  const auto grads_double = gradients<double>(f, cast<double>(dz), cast<double>(x), cast<double>(y));
  // A broadcast operand's gradient is a sum over the broadcast axes, in f32: allow for its length.
  const double terms_x = static_cast<double>(out.numel() / std::max<std::int64_t>(x.numel(), 1));
  const double terms_y = static_cast<double>(out.numel() / std::max<std::int64_t>(y.numel(), 1));
  check_close(grads[0], grads_double[0], {tol.rtol, tol.atol * terms_x});
  check_close(grads[1], grads_double[1], {tol.rtol, tol.atol * terms_y});

  if constexpr (std::is_same_v<T, double>) {
    CHECK(gradcheck([](const std::vector<Var<double>>& in) -> Var<double> { return Case::apply(in[0], in[1]); },
                    {x, y}, gradcheck_options(out)));
  }
}

}  // namespace tapegrad::test

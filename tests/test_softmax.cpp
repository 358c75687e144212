#include <doctest/doctest.h>

#include <cmath>
#include <span>
#include <string>

#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::Tolerance;

namespace {

struct Case {
  Shape shape;
  int axis;
};
const Case cases[] = {{{7}, 0},       {{7}, -1},       {{3, 4, 5}, 0},   {{3, 4, 5}, 1},
                      {{3, 4, 5}, 2}, {{3, 4, 5}, -2}, {{2, 3, 2, 3}, 1}};
const Case low_precision_cases[] = {{{3, 4, 5}, 1}, {{2, 3, 11}, -1}, {{64, 300}, -1}, {{64, 300}, 0}};

template <class T> Var<T> apply(bool log, const Var<T>& x, int axis) {
  return log ? log_softmax(x, axis) : softmax(x, axis);
}
std::string name(bool log) { return log ? "log_softmax" : "softmax"; }

// Calls body(log, c) for softmax and log_softmax over every case, captured for reports.
template <class Body> void for_each_case(std::span<const Case> cases, Body body) {
  for (bool log : {false, true}) {
    for (const Case& c : cases) {
      const std::string op = name(log);
      CAPTURE(op);
      CAPTURE(c.shape);
      CAPTURE(c.axis);
      body(log, c);
    }
  }
}

// The textbook formulas along `axis`, one line at a time, in double.
Tensor<double> reference(bool log, const Tensor<double>& x, int axis) {
  const Shape& s = x.shape();
  const int a = axis < 0 ? axis + s.rank() : axis;
  std::int64_t outer = 1, inner = 1;
  for (int i = 0; i < a; ++i) outer *= s[i];
  for (int i = a + 1; i < s.rank(); ++i) inner *= s[i];
  const std::int64_t n = s[a];
  Tensor<double> y(s);
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t i = 0; i < inner; ++i) {
      auto at = [&](std::int64_t k) { return (o * n + k) * inner + i; };
      double sum = 0.0;
      for (std::int64_t k = 0; k < n; ++k) sum += std::exp(x.flat(at(k)));
      for (std::int64_t k = 0; k < n; ++k) {
        y.flat(at(k)) = log ? x.flat(at(k)) - std::log(sum) : std::exp(x.flat(at(k))) / sum;
      }
    }
  }
  return y;
}

// Forward against the double reference on the same rounded inputs: the output's rounding (half an ulp: 2⁻²⁴, 2⁻⁹,
// 2⁻¹² relative) plus f32 arithmetic on values of size |x| (absolute, for log_softmax outputs near zero).
template <class T> constexpr Tolerance forward_tolerance{};
template <> constexpr Tolerance forward_tolerance<float>{1e-5, 1e-6};
template <> constexpr Tolerance forward_tolerance<bf16>{8e-3, 1e-4};
template <> constexpr Tolerance forward_tolerance<f16>{1.5e-3, 1e-4};
// Backward against the double backward: the same, plus cancellation in dy - Σ dy·p (absolute, of the size of dy·p).
template <class T> constexpr Tolerance backward_tolerance{};
template <> constexpr Tolerance backward_tolerance<float>{1e-5, 1e-6};
template <> constexpr Tolerance backward_tolerance<bf16>{1e-2, 1e-3};
template <> constexpr Tolerance backward_tolerance<f16>{2e-3, 1e-4};

template <class T> Tensor<T> gradient(bool log, const Tensor<T>& x, int axis, const Tensor<T>& dy) {
  auto v = param(x);
  backward(apply(log, v, axis), dy);
  return v.grad();
}

}  // namespace

TEST_CASE("softmax and log_softmax match the textbook formulas along every axis") {
  for_each_case(cases, [](bool log, const Case& c) {
    const Tensor<double> x = randn<double>(c.shape, 1, 0.0, 3.0);
    test::check_close(apply(log, constant(x), c.axis).value(), reference(log, x, c.axis), {1e-13, 1e-15});
  });
}

TEST_CASE("softmax and log_softmax record one node and pass gradcheck along every axis") {
  for_each_case(cases, [](bool log, const Case& c) {
    const Tensor<double> x = randn<double>(c.shape, 2, 0.0, 2.0);
    {
      Tape tape;
      TapeScope scope(tape);
      apply(log, param(x), c.axis);
      CHECK(tape.size() == 1);
    }
    CHECK(gradcheck([&](const std::vector<Var<double>>& v) { return apply(log, v[0], c.axis); }, {x}));
  });
}

TEST_CASE_TEMPLATE("softmax and log_softmax of huge logits do not overflow", T, double, float) {
  const Tensor<T> x = randn<T>({4, 9}, 3, 1000.0, 3.0);  // exp(x) overflows even in double
  // Both ops are invariant under a shift of x (log_softmax's output does not contain it): the reference gets x - 1000,
  // which is exact in double.
  Tensor<double> centered = cast<double>(x);
  for (std::int64_t i = 0; i < centered.numel(); ++i) centered.flat(i) -= 1000.0;
  for (bool log : {false, true}) {
    const std::string op = name(log);
    CAPTURE(op);
    // atol: f32 arithmetic on values near 1000, whose ulp is 6e-5.
    test::check_close(apply(log, constant(x), -1).value(), reference(log, centered, -1), {1e-5, 1e-4});
  }
}

TEST_CASE("softmax takes an expression") {
  const auto a = param(randn<double>({2, 5}, 4));
  const Var<double> y = softmax(a * 2.0, 0);
  CHECK(y.shape() == Shape{2, 5});
}

TEST_CASE_TEMPLATE("low-precision softmax and log_softmax match the double reference, forward and backward", T, float,
                   bf16, f16) {
  for_each_case(low_precision_cases, [](bool log, const Case& c) {
    const Tensor<T> x = randn<T>(c.shape, 5, 0.0, 2.0);
    test::check_close(apply(log, constant(x), c.axis).value(), reference(log, cast<double>(x), c.axis),
                      forward_tolerance<T>);
    const Tensor<T> dy = randn<T>(c.shape, 6);
    test::check_close(gradient(log, x, c.axis, dy), gradient(log, cast<double>(x), c.axis, cast<double>(dy)),
                      backward_tolerance<T>);
  });
}

TEST_CASE("softmax errors name the op, the axis and the shape") {
  const auto x = constant(randn<double>({2, 3}, 7));
  CHECK_THROWS_WITH_AS(softmax(x, 2), doctest::Contains("softmax: axis 2 is out of range for shape [2, 3] of rank 2"),
                       Error);
  CHECK_THROWS_WITH_AS(log_softmax(x, -3),
                       doctest::Contains("log_softmax: axis -3 is out of range for shape [2, 3] of rank 2"), Error);
  CHECK_THROWS_WITH_AS(softmax(constant(full<double>({}, 1.0))),
                       doctest::Contains("softmax: axis -1 is out of range for shape [] of rank 0"), Error);
}

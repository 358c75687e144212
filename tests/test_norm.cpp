#include <doctest/doctest.h>

#include <cmath>
#include <span>
#include <string>

#include "norm_cases.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::Tolerance;
using namespace test::norm_cases;

namespace {

template <class T> struct Inputs { Tensor<T> x, gamma, beta; };
template <class T> Inputs<T> make_inputs(const Shape& shape, std::uint64_t seed) {
  const Shape hidden{shape.dim(-1)};
  return {randn<T>(shape, seed, 0.5, 2.0), randn<T>(hidden, seed + 1, 1.0, 0.5), randn<T>(hidden, seed + 2)};
}

// The textbook formulas, element by element in double.
Tensor<double> reference(Kind kind, const Inputs<double>& in, const NormOptions& options) {
  const std::int64_t H = in.x.dim(-1), rows = in.x.numel() / H;
  Tensor<double> y(in.x.shape());
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean = 0.0, var = 0.0;
    if (kind != Kind::rmsnorm) {
      for (std::int64_t j = 0; j < H; ++j) mean += in.x.flat(r * H + j) / double(H);
    }
    for (std::int64_t j = 0; j < H; ++j) var += std::pow(in.x.flat(r * H + j) - mean, 2) / double(H);
    for (std::int64_t j = 0; j < H; ++j) {
      const double scale = in.gamma.flat(j) + (options.zero_centered_gamma ? 1.0 : 0.0);
      const double shift = kind == Kind::layernorm ? in.beta.flat(j) : 0.0;
      y.flat(r * H + j) = (in.x.flat(r * H + j) - mean) / std::sqrt(var + options.epsilon) * scale + shift;
    }
  }
  return y;
}

template <class T> Inputs<double> to_double(const Inputs<T>& in) {
  return {cast<double>(in.x), cast<double>(in.gamma), cast<double>(in.beta)};
}

const Shape shapes[] = {{5}, {3, 7}, {2, 3, 11}};
const Shape low_precision_shapes[] = {{5}, {3, 7}, {2, 3, 11}, {64, 257}};

// Calls body(kind, options, shape) for every op, zero_centered_gamma setting and shape, captured for reports.
template <class Body> void for_each_case(std::span<const Shape> shapes, Body body) {
  for (Kind kind : all_kinds) {
    for (bool zero_centered : {false, true}) {
      for (const Shape& shape : shapes) {
        const std::string op = name(kind);
        CAPTURE(op);
        CAPTURE(zero_centered);
        CAPTURE(shape);
        body(kind, NormOptions{.epsilon = 1e-5, .zero_centered_gamma = zero_centered}, shape);
      }
    }
  }
}

// Forward against the double reference on the same rounded inputs: the output's own rounding (half an ulp: 2⁻²⁴,
// 2⁻⁹, 2⁻¹² relative) plus the f32 arithmetic of the statistics.
template <class T> constexpr Tolerance forward_tolerance{};
template <> constexpr Tolerance forward_tolerance<float>{1e-5, 1e-5};
template <> constexpr Tolerance forward_tolerance<bf16>{8e-3, 1e-4};
template <> constexpr Tolerance forward_tolerance<f16>{1.5e-3, 1e-4};
// Backward against the double backward: the same rounding, plus cancellation in dx = rstd·(dx̂ - mean - x̂·mean),
// whose terms are O(1) while dx can be small (hence the atol), and sums over up to 64 rows for dgamma/dbeta.
template <class T> constexpr Tolerance backward_tolerance{};
template <> constexpr Tolerance backward_tolerance<float>{1e-4, 1e-5};
template <> constexpr Tolerance backward_tolerance<bf16>{1e-2, 2e-3};
template <> constexpr Tolerance backward_tolerance<f16>{2e-3, 2e-4};

template <class T> struct Grads {
  Tensor<T> dx, dgamma, dbeta;  // dbeta stays undefined unless kind is Kind::layernorm
};
// The gradients of apply(kind, ...) for the seed dy.
template <class T>
Grads<T> gradients(Kind kind, const Inputs<T>& in, const Tensor<T>& dy, const NormOptions& options = {}) {
  auto x = param(in.x), gamma = param(in.gamma), beta = param(in.beta);
  backward(apply(kind, x, gamma, beta, options), dy);
  return {x.grad(), gamma.grad(), beta.grad()};
}

}  // namespace

TEST_CASE("layernorm and rmsnorm match the textbook formulas in double") {
  for_each_case(shapes, [](Kind kind, const NormOptions& options, const Shape& shape) {
    const auto in = make_inputs<double>(shape, 10);
    const Var<double> y = apply(kind, constant(in.x), constant(in.gamma), constant(in.beta), options);
    test::check_close(y.value(), reference(kind, in, options), {1e-12, 1e-12});
  });
}

TEST_CASE("layernorm and rmsnorm record one node and pass gradcheck for every option") {
  for_each_case(shapes, [](Kind kind, const NormOptions& options, const Shape& shape) {
    const auto in = make_inputs<double>(shape, 20);
    {
      Tape tape;
      TapeScope scope(tape);
      apply(kind, param(in.x), param(in.gamma), param(in.beta), options);
      CHECK(tape.size() == 1);
    }
    std::vector<Tensor<double>> inputs{in.x, in.gamma};
    if (kind == Kind::layernorm) inputs.push_back(in.beta);
    CHECK(gradcheck(
        [&](const std::vector<Var<double>>& v) {
          return apply(kind, v[0], v[1], v.size() > 2 ? v[2] : Var<double>(), options);
        },
        inputs));
  });
}

TEST_CASE("layernorm without beta is layernorm with zero beta, and zero-centered gamma scales by 1 + gamma") {
  const auto in = make_inputs<double>({4, 9}, 30);
  const auto x = constant(in.x), gamma = constant(in.gamma);
  test::check_close(layernorm(x, gamma).value(), layernorm(x, gamma, constant(zeros<double>({9}))).value(), {0, 0});
  const auto gamma_minus_one = constant(cast<double>(eval(gamma - 1.0).value()));
  for (Kind kind : all_kinds) {
    const std::string op = name(kind);
    CAPTURE(op);
    const auto shifted = apply(kind, x, gamma_minus_one, constant(in.beta), {.zero_centered_gamma = true});
    test::check_close(shifted.value(), apply(kind, x, gamma, constant(in.beta), {}).value(), {1e-14, 1e-14});
  }
}

TEST_CASE("layernorm takes an expression for x and computes only the gradients asked for") {
  const auto in = make_inputs<double>({3, 5}, 40);
  auto x = param(in.x);
  const auto gamma = constant(in.gamma), beta = constant(in.beta);
  backward(layernorm(x * 2.0, gamma, beta), randn<double>({3, 5}, 41));
  CHECK(x.grad().shape() == Shape{3, 5});
  CHECK_FALSE(gamma.grad().defined());
  CHECK_FALSE(beta.grad().defined());
}

TEST_CASE_TEMPLATE("low-precision layernorm and rmsnorm match the double reference, forward and backward", T, float,
                   bf16, f16) {
  for_each_case(low_precision_shapes, [](Kind kind, const NormOptions& options, const Shape& shape) {
    const auto in = make_inputs<T>(shape, 50);
    const Var<T> y = apply(kind, constant(in.x), constant(in.gamma), constant(in.beta), options);
    test::check_close(y.value(), reference(kind, to_double(in), options), forward_tolerance<T>);

    const Tensor<T> dy = randn<T>(shape, 51);
    const auto got = gradients(kind, in, dy, options);
    const auto want = gradients(kind, to_double(in), cast<double>(dy), options);
    test::check_close(got.dx, want.dx, backward_tolerance<T>);
    test::check_close(got.dgamma, want.dgamma, backward_tolerance<T>);
    if (kind == Kind::layernorm) test::check_close(got.dbeta, want.dbeta, backward_tolerance<T>);
  });
}

// Rows near `offset` spaced by multiples of `step` (exact in T): the mean is large and the spread small, so
// statistics kept in T would lose the spread.
template <class T> struct LargeMean;
template <> struct LargeMean<bf16> { static constexpr double offset = 20480.0, step = 128.0; };
template <> struct LargeMean<f16> { static constexpr double offset = 1000.0, step = 0.5; };

TEST_CASE_TEMPLATE("statistics are f32: a large mean with a small spread still normalizes accurately", T, bf16, f16) {
  const Shape shape{6, 64};
  const Tensor<std::int64_t> k = rand_int<std::int64_t>(shape, 60, -4, 5);
  Inputs<T> in = make_inputs<T>(shape, 61);
  for (std::int64_t i = 0; i < k.numel(); ++i) {
    in.x.flat(i) = convert<T>(LargeMean<T>::offset + LargeMean<T>::step * double(k.flat(i)));
  }
  for (Kind kind : {Kind::layernorm, Kind::layernorm_no_beta}) {
    const std::string op = name(kind);
    CAPTURE(op);
    const Var<T> y = apply(kind, constant(in.x), constant(in.gamma), constant(in.beta), {});
    test::check_close(y.value(), reference(kind, to_double(in), {}), forward_tolerance<T>);
  }
}

TEST_CASE_TEMPLATE("dgamma, dbeta and dx do not depend on the thread count", T, float, double, bf16) {
  const Shape shape{512, 64};  // large enough for several row blocks on the pool
  const auto in = make_inputs<T>(shape, 70);
  const Tensor<T> dy = randn<T>(shape, 71);
  auto run = [&](int threads) {
    test::ThreadCount scope(threads);
    return gradients(Kind::layernorm, in, dy);
  };
  const auto one = run(1), two = run(2);
  CHECK(test::bitwise_equal(one.dx, two.dx));
  CHECK(test::bitwise_equal(one.dgamma, two.dgamma));
  CHECK(test::bitwise_equal(one.dbeta, two.dbeta));
}

TEST_CASE("norm errors name the op and the shapes") {
  const auto x = constant(randn<double>({3, 7}, 80));
  const auto gamma = constant(randn<double>({7}, 81));
  const auto wrong = constant(randn<double>({5}, 82));
  CHECK_THROWS_WITH_AS(
      layernorm(x, wrong),
      doctest::Contains("layernorm: gamma has shape [5] but x has shape [3, 7]; expected gamma of shape [7]"), Error);
  CHECK_THROWS_WITH_AS(
      layernorm(x, gamma, wrong),
      doctest::Contains("layernorm: beta has shape [5] but x has shape [3, 7]; expected beta of shape [7]"), Error);
  CHECK_THROWS_WITH_AS(rmsnorm(x, wrong), doctest::Contains("rmsnorm: gamma has shape [5] but x has shape [3, 7]"),
                       Error);
  CHECK_THROWS_WITH_AS(layernorm(constant(full<double>({}, 2.0)), constant(ones<double>({1}))),
                       doctest::Contains("layernorm: x must have at least one axis (the normalized one), got shape []"),
                       Error);
  CHECK_THROWS_WITH_AS(rmsnorm(x, gamma, {.epsilon = 0.0}),
                       doctest::Contains("rmsnorm: epsilon must be positive, got 0"), Error);
  CHECK_THROWS_WITH_AS(layernorm(x, gamma, {.epsilon = -1e-5}),
                       doctest::Contains("layernorm: epsilon must be positive, got -1e-05"), Error);
  CHECK_THROWS_WITH_AS(layernorm(x, gamma, {.epsilon = INFINITY}),
                       doctest::Contains("layernorm: epsilon must be finite, got inf"), Error);
  CHECK_THROWS_WITH_AS(rmsnorm(x, gamma, {.epsilon = NAN}), doctest::Contains("rmsnorm: epsilon must be positive, got nan"),
                       Error);
}

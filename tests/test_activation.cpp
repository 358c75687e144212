#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "elementwise_checks.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::check_close;
using test::exact;
using test::Domain;

namespace {
// Plain double formulas, written independently of cuda/detail/activation_math.hpp.
double sigmoid_ref(double x) { return 1 / (1 + std::exp(-x)); }
double gelu_ref(double x) { return x * 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
}  // namespace

namespace cases {
UNARY_CASE(Tanh, Domain::any, tanh(x), std::tanh(x))
UNARY_CASE(Sigmoid, Domain::any, sigmoid(x), sigmoid_ref(x))
UNARY_CASE(Relu, Domain::away_from_zero, relu(x), x > 0 ? x : 0.0)
UNARY_CASE(Gelu, Domain::any, gelu(x), gelu_ref(x))
UNARY_CASE(GeluTanh, Domain::any, gelu_tanh(x), gelu_tanh_ref(x))
UNARY_CASE(Silu, Domain::any, silu(x), x * sigmoid_ref(x))
UNARY_CASE(QuickGelu, Domain::any, quick_gelu(x), x * sigmoid_ref(1.702 * x))
UNARY_CASE(SquaredRelu, Domain::away_from_zero, squared_relu(x), x > 0 ? x * x : 0.0)
}  // namespace cases

namespace {
const std::vector<Shape> shapes{{}, {7}, {3, 5}, {2, 3, 4}, {129, 67}};
}

TEST_CASE_TEMPLATE("activations match a double reference, forward and backward", T, double, float, bf16, f16) {
  test::for_each_case<cases::Tanh, cases::Sigmoid, cases::Relu, cases::Gelu, cases::GeluTanh, cases::Silu,
                      cases::QuickGelu, cases::SquaredRelu>([&]<class Case>() {
    std::uint64_t seed = 300;
    for (const Shape& shape : shapes) test::check_unary<Case, T>(shape, seed += 10);
  });
}

TEST_CASE("activations fuse with the arithmetic around them into one node") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> a = param(randn<double>({3, 4}, 1)), b = param(randn<double>({4}, 2));
  Var<double> y = gelu(a * b + 1.0) * sigmoid(b) - silu(a);
  CHECK(tape.size() == 1);
  CHECK(tape.node(0).name() == "sub(mul(gelu(add_scalar(mul(x0, x1))), sigmoid(x2)), silu(x3))");
  CHECK(gradcheck(
      [](const std::vector<Var<double>>& in) -> Var<double> {
        return gelu(in[0] * in[1] + 1.0) * sigmoid(in[1]) - silu(in[0]) + quick_gelu(tanh(in[1]));
      },
      {a.value(), b.value()}));
}

TEST_CASE("relu and squared_relu pass no gradient below zero") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = param(from_vector<double>({-2.0, -0.5, 0.5, 2.0}, {4}));
  backward(eval(relu(x) + squared_relu(x)), ones<double>({4}));
  check_close(x.grad(), from_vector<double>({0.0, 0.0, 2.0, 5.0}, {4}), exact);
}

namespace {
// The limits of the activations at large |x|, where each is a rectifier or a step.
double positive_part(double x) { return x > 0 ? x : 0.0; }
double step(double x) { return x > 0 ? 1.0 : 0.0; }
double sign(double x) { return x > 0 ? 1.0 : -1.0; }
double zero(double) { return 0.0; }
double squared_positive_part(double x) { return positive_part(x) * positive_part(x); }
double twice_positive_part(double x) { return 2 * positive_part(x); }

// `got` is `expected` exactly where that is infinite, and otherwise within 1e-6: exact for the activations of
// ops/detail/activation_arrays.hpp (and so for every large finite value), the slack being for Eigen's f32 tanh and
// logistic, which may saturate short of ±1 and 0.
void check_limit(double got, double expected) {
  CHECK_FALSE(std::isnan(got));
  if (std::isinf(expected)) {
    CHECK(got == expected);
  } else {
    CHECK(std::abs(got - expected) <= 1e-6);
  }
}
}  // namespace

TEST_CASE_TEMPLATE("activations of huge and infinite inputs take their limits, values and gradients", T, double,
                   float, bf16, f16) {
  const double inf = std::numeric_limits<double>::infinity();
  // 1e30 is infinite in f16, and squares to infinity in every type but double.
  const Tensor<T> xv = cast<T>(from_vector<double>({-inf, -1e30, -1e4, 1e4, 1e30, inf}, {6}));
  const auto check_limits = [&](const char* name, const auto& f, double (*value)(double), double (*slope)(double)) {
    Tape tape;
    TapeScope scope(tape);
    Var<T> x = param(xv);
    const Var<T> y = eval(f(x));
    backward(y, ones<T>({6}));
    for (std::int64_t i = 0; i < 6; ++i) {
      const double xi = convert<double>(xv.flat(i));
      INFO(name << " at " << xi);
      check_limit(convert<double>(y.value().flat(i)), convert<double>(convert<T>(value(xi))));
      check_limit(convert<double>(x.grad().flat(i)), convert<double>(convert<T>(slope(xi))));
    }
  };
  check_limits("tanh", [](const auto& x) { return tanh(x); }, sign, zero);
  check_limits("sigmoid", [](const auto& x) { return sigmoid(x); }, step, zero);
  check_limits("relu", [](const auto& x) { return relu(x); }, positive_part, step);
  check_limits("gelu", [](const auto& x) { return gelu(x); }, positive_part, step);
  check_limits("gelu_tanh", [](const auto& x) { return gelu_tanh(x); }, positive_part, step);
  check_limits("silu", [](const auto& x) { return silu(x); }, positive_part, step);
  check_limits("quick_gelu", [](const auto& x) { return quick_gelu(x); }, positive_part, step);
  check_limits("squared_relu", [](const auto& x) { return squared_relu(x); }, squared_positive_part,
               twice_positive_part);
}

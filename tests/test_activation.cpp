#include <doctest/doctest.h>

#include <cmath>

#include "elementwise_checks.hpp"
#include "tapegrad.hpp"

using namespace tapegrad;
using test::check_close;
using test::exact;
using test::Domain;

namespace {
// Plain double formulas, written independently of ops/activation_math.hpp.
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

TEST_CASE_TEMPLATE("activations of huge inputs have finite gradients", T, double, float, bf16) {
  Tape tape;
  TapeScope scope(tape);
  const Tensor<T> xv = cast<T>(from_vector<double>({-1e30, -1e4, -30.0, 30.0, 1e4, 1e30}, {6}));
  const auto check_finite = [&](const char* name, const auto& f) {
    Var<T> x = param(xv);
    backward(eval(f(x)), ones<T>({6}));
    for (std::int64_t i = 0; i < 6; ++i) {
      INFO(std::string(name));
      CAPTURE(convert<double>(xv.flat(i)));
      CHECK(std::isfinite(convert<double>(x.grad().flat(i))));
    }
  };
  check_finite("tanh", [](const auto& x) { return tanh(x); });
  check_finite("sigmoid", [](const auto& x) { return sigmoid(x); });
  check_finite("relu", [](const auto& x) { return relu(x); });
  check_finite("gelu", [](const auto& x) { return gelu(x); });
  check_finite("gelu_tanh", [](const auto& x) { return gelu_tanh(x); });
  check_finite("silu", [](const auto& x) { return silu(x); });
  check_finite("quick_gelu", [](const auto& x) { return quick_gelu(x); });
}

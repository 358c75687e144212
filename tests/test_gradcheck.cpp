#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <sstream>

#include "core_test_helpers.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::zip;

namespace {

// x·y whose backward reports dz/dx as `scale`·y·dz + `offset` (right when scale = 1 and offset = 0).
Var<double> mul_with_error(const Var<double>& x, const Var<double>& y, double scale, double offset) {
  struct Saved {
    Tensor<double> x, y;
  };
  return custom_op<Saved>(
      "mul_with_error",
      [](Saved& s, const Tensor<double>& a, const Tensor<double>& b) {
        s.x = a;
        s.y = b;
        return zip(a, b, std::multiplies<>());
      },
      [scale, offset](const Saved& s, const NeedsGrad&, const Tensor<double>& dz) {
        const Tensor<double> dx = zip(s.y, dz, [=](double y, double g) { return scale * y * g + offset; });
        return std::make_tuple(dx, zip(s.x, dz, std::multiplies<>()));
      },
      x, y);
}

GradcheckFunction mul_with_error_fn(double scale, double offset = 0.0) {
  return [=](const std::vector<Var<double>>& in) { return mul_with_error(in[0], in[1], scale, offset); };
}

// Exact in binary: with a power-of-two eps the finite differences of x·y are exact too.
const Tensor<double> x3 = from_vector<double>({1.0, 2.0, 3.0}, {3});
const Tensor<double> y3 = from_vector<double>({0.5, 4.0, 1.0}, {3});
const double exact_eps = std::ldexp(1.0, -20);

std::string printed(const GradcheckResult& r) {
  std::ostringstream out;
  out << r;
  return out.str();
}

}  // namespace

TEST_CASE("gradcheck passes correct gradients") {
  CHECK(gradcheck(mul_with_error_fn(1.0), {x3, y3}));
  CHECK(gradcheck(mul_with_error_fn(1.0), {randn<double>({4, 3}, 1), randn<double>({4, 3}, 2)}));
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return sum(in[0] * exp(in[1])); },
                  {randn<double>({2, 5}, 3), randn<double>({2, 5}, 4)}));
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return in[0] * in[0]; }, {randn<double>({}, 5)}));
}

TEST_CASE("gradcheck fails a wrong backward and names the input, the element and both values") {
  const GradcheckResult r = gradcheck(mul_with_error_fn(2.0), {x3, y3}, {.eps = exact_eps});
  CHECK_FALSE(r);
  CHECK_FALSE(r.passed);
  // dz[i]/dx[i] = y[i]: the worst entry is the largest, y[1] = 4, reported as 8.
  CHECK(r.input == 0);
  CHECK(r.input_element == 1);
  CHECK(r.output_element == 1);
  CHECK(r.analytic == 8.0);
  CHECK(r.numeric == 4.0);
  CHECK(r.report ==
        "gradcheck FAILED over 18 Jacobian entries; worst d output[1] / d input 0[1] (input shape [3]): analytic 8 vs "
        "numeric 4 (|diff| 4, allowed 1e-05 + 0.001·|numeric|)");
}

TEST_CASE("gradcheck names the second input when its gradient is the wrong one") {
  const GradcheckFunction swapped = [](const std::vector<Var<double>>& in) {
    return mul_with_error(in[1], in[0], 2.0, 0.0);  // in[1] now takes the wrong gradient
  };
  const GradcheckResult r = gradcheck(swapped, {y3, x3}, {.eps = exact_eps});
  CHECK_FALSE(r);
  CHECK(r.input == 1);
  CHECK(r.input_element == 1);
  CHECK(r.report.find("d input 1[1]") != std::string::npos);
}

TEST_CASE("fast mode passes and fails the same way") {
  const GradcheckOptions fast{.fast_mode = true};
  const std::vector<Tensor<double>> inputs{randn<double>({5, 4}, 6), randn<double>({5, 4}, 7)};
  CHECK(gradcheck(mul_with_error_fn(1.0), inputs, fast));
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return sum(in[0] * exp(in[1])); }, inputs, fast));
  const GradcheckResult r = gradcheck(mul_with_error_fn(2.0), inputs, fast);
  CHECK_FALSE(r);
  CHECK(r.input_element == -1);
  CHECK(r.output_element == -1);
  CHECK(r.report.find("gradcheck FAILED over 3 projections") != std::string::npos);
  CHECK(r.report.find("(vᵀJu)") != std::string::npos);
  const GradcheckResult seven = gradcheck(mul_with_error_fn(1.0), inputs, {.fast_mode = true, .projections = 7});
  CHECK(seven.report.find("over 7 projections") != std::string::npos);
}

TEST_CASE("rtol bounds the relative error") {
  // A gradient 1e-4 too large relative: within the default rtol 1e-3, not within 1e-5.
  const std::vector<Tensor<double>> inputs{x3, y3};
  CHECK(gradcheck(mul_with_error_fn(1.0001), inputs, {.eps = exact_eps}));
  CHECK_FALSE(gradcheck(mul_with_error_fn(1.0001), inputs, {.eps = exact_eps, .atol = 0.0, .rtol = 1e-5}));
  CHECK(gradcheck(mul_with_error_fn(1.0001), inputs, {.eps = exact_eps, .atol = 0.0, .rtol = 2e-4}));
}

TEST_CASE("atol bounds the absolute error") {
  // A gradient off by 1e-6 everywhere, also where the true value is 0 (off-diagonal Jacobian entries).
  const std::vector<Tensor<double>> inputs{x3, y3};
  CHECK(gradcheck(mul_with_error_fn(1.0, 1e-6), inputs, {.eps = exact_eps}));
  const GradcheckResult r = gradcheck(mul_with_error_fn(1.0, 1e-6), inputs, {.eps = exact_eps, .atol = 1e-7});
  CHECK_FALSE(r);
  CHECK(r.report.find("allowed 1e-07 + 0.001·|numeric|") != std::string::npos);
}

TEST_CASE("eps sets the finite-difference step") {
  // Central differences of x³ are off by eps²: fine at 1e-6, not at 0.1.
  const GradcheckFunction cube = [](const std::vector<Var<double>>& in) { return in[0] * in[0] * in[0]; };
  const std::vector<Tensor<double>> x{from_vector<double>({1.0}, {1})};
  CHECK(gradcheck(cube, x));
  const GradcheckResult r = gradcheck(cube, x, {.eps = 0.1});
  CHECK_FALSE(r);
  CHECK(r.analytic == doctest::Approx(3.0));
  CHECK(r.numeric == doctest::Approx(3.01));
}

TEST_CASE("a NaN gradient fails") {
  CHECK_FALSE(gradcheck(mul_with_error_fn(1.0, std::numeric_limits<double>::quiet_NaN()), {x3, y3}));
}

TEST_CASE("an input f ignores has a zero gradient and passes") {
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return in[0] * 2.0; },
                  {randn<double>({3}, 8), randn<double>({2}, 9)}));
}

TEST_CASE("gradcheck throws when f does not depend on its inputs") {
  const GradcheckFunction constant_f = [](const std::vector<Var<double>>&) { return constant(ones<double>({2})); };
  CHECK_THROWS_WITH_AS(gradcheck(constant_f, {x3}), "gradcheck: the output of shape [2] does not depend on any input",
                       Error);
  CHECK_THROWS_AS(gradcheck(constant_f, {x3}, {.fast_mode = true}), Error);
  const GradcheckFunction detached = [](const std::vector<Var<double>>& in) { return in[0].detach() * 2.0; };
  CHECK_THROWS_WITH_AS(gradcheck(detached, {x3}), doctest::Contains("does not depend on any input"), Error);
}

TEST_CASE("gradcheck refuses no inputs and a non-positive eps") {
  const GradcheckFunction f = [](const std::vector<Var<double>>& in) { return in[0] * 2.0; };
  CHECK_THROWS_WITH_AS(gradcheck(f, {}), "gradcheck: no inputs given", Error);
  CHECK_THROWS_WITH_AS(gradcheck(f, {x3}, {.eps = 0.0}), "gradcheck: eps must be positive, got 0", Error);
}

TEST_CASE("gradcheck leaves the inputs and the active tape alone") {
  Tape tape;
  TapeScope scope(tape);
  const Tensor<double> x = randn<double>({3}, 10);
  const Tensor<double> before = x.clone();
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return exp(in[0]); }, {x}));
  CHECK(tape.size() == 0);
  for (std::int64_t i = 0; i < 3; ++i) CHECK(x.flat(i) == before.flat(i));
}

TEST_CASE("the printed result is the report, for doctest's CHECK to show") {
  const GradcheckResult bad = gradcheck(mul_with_error_fn(2.0), {x3, y3});
  CHECK(printed(bad) == bad.report);
  CHECK(printed(bad).rfind("gradcheck FAILED", 0) == 0);
  const GradcheckResult good = gradcheck(mul_with_error_fn(1.0), {x3, y3});
  CHECK(printed(good).rfind("gradcheck passed over 18 Jacobian entries", 0) == 0);
}

TEST_CASE("gradcheck refuses an infinite eps and NaN or negative tolerances, which would pass everything") {
  const GradcheckFunction f = [](const std::vector<Var<double>>& in) { return in[0] * 2.0; };
  CHECK_THROWS_WITH_AS(gradcheck(f, {x3}, {.eps = INFINITY}), "gradcheck: eps must be finite, got inf", Error);
  CHECK_THROWS_WITH_AS(gradcheck(f, {x3}, {.atol = NAN}),
                       doctest::Contains("gradcheck: atol and rtol must be non-negative numbers, got nan"), Error);
  CHECK_THROWS_WITH_AS(gradcheck(f, {x3}, {.rtol = -1}), doctest::Contains("and -1"), Error);
  CHECK_THROWS_WITH_AS(gradcheck(f, {x3, Tensor<double>()}),
                       "gradcheck: input 1 is undefined (a default-constructed Tensor, with no storage)", Error);
}

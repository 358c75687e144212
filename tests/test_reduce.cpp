#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "tapegrad/ops/detail/axes.hpp"
#include "reference.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::ravel;
using test::unravel;

namespace {

enum class Kind { sum, mean, max };
const char* name(Kind k) { return k == Kind::sum ? "sum" : k == Kind::mean ? "mean" : "max"; }

Var<double> reduce(Kind k, const Var<double>& x, const std::vector<int>& axes, bool keepdim) {
  switch (k) {
    case Kind::sum: return sum(x, axes, keepdim);
    case Kind::mean: return mean(x, axes, keepdim);
    case Kind::max: return max(x, axes, keepdim);
  }
  return {};
}

// The reduction element by element: each element of x goes to the output index with the reduced axes dropped.
Tensor<double> naive_reduce(Kind kind, const Tensor<double>& x, const std::vector<int>& axes, bool keepdim) {
  const int rank = x.rank();
  std::vector<bool> reduced(static_cast<std::size_t>(rank), axes.empty());
  for (int a : axes) reduced[static_cast<std::size_t>(a < 0 ? a + rank : a)] = true;
  std::vector<std::int64_t> out_dims;
  std::int64_t group = 1;
  for (int a = 0; a < rank; ++a) {
    if (reduced[static_cast<std::size_t>(a)]) group *= x.dim(a);
    if (!reduced[static_cast<std::size_t>(a)]) out_dims.push_back(x.dim(a));
    else if (keepdim) out_dims.push_back(1);
  }
  const Shape out_shape(out_dims);
  Tensor<double> y = full<double>(out_shape, kind == Kind::max ? -INFINITY : 0.0);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    std::vector<std::int64_t> out;
    const auto idx = unravel(i, x.shape());
    for (int a = 0; a < rank; ++a) {
      if (!reduced[static_cast<std::size_t>(a)]) out.push_back(idx[static_cast<std::size_t>(a)]);
      else if (keepdim) out.push_back(0);
    }
    double& acc = y.flat(ravel(out, out_shape));
    acc = kind == Kind::max ? std::max(acc, x.flat(i)) : acc + x.flat(i);
  }
  if (kind == Kind::mean) {
    for (std::int64_t j = 0; j < y.numel(); ++j) y.flat(j) /= static_cast<double>(group);
  }
  return y;
}

struct Case {
  Shape shape;
  std::vector<int> axes;
  bool keepdim = false;
};

// Every kind of axis set: none given (all), contiguous, non-contiguous, negative, size-1 axes between, rank 0 to 6.
const std::vector<Case> cases = {
    {{}, {}},
    {{7}, {}},
    {{7}, {0}, true},
    {{3, 4}, {0}},
    {{3, 4}, {1}},
    {{3, 4}, {-1}, true},
    {{3, 4}, {}, true},
    {{2, 3, 4}, {1}},
    {{2, 3, 4}, {1, 2}},
    {{2, 3, 4}, {0, 1}},
    {{2, 3, 4}, {0, 2}},
    {{2, 3, 4}, {-3, -1}, true},
    {{2, 3, 4}, {2, 0}},
    {{2, 1, 3, 4}, {0, 2}},  // contiguous once the size-1 axis is set aside
    {{4, 1}, {1}},           // only a size-1 axis
    {{5, 7, 3}, {0}},
    {{2, 3, 1, 4, 2}, {0, 2, 4}},
    {{2, 3, 1, 4, 2}, {1, 3}, true},
    {{3, 2, 2, 3, 2, 2}, {1, 3, 5}},
};

}  // namespace

TEST_CASE("sum, mean and max match a naive reduction for every axis pattern") {
  for (const Case& c : cases) {
    CAPTURE(c.shape);
    CAPTURE(list_str(c.axes));
    CAPTURE(c.keepdim);
    const Tensor<double> x = randn<double>(c.shape, 7);
    for (Kind k : {Kind::sum, Kind::mean, Kind::max}) {
      CAPTURE(name(k));
      test::check_close(reduce(k, constant(x), c.axes, c.keepdim).value(), naive_reduce(k, x, c.axes, c.keepdim),
                        {1e-12, 1e-12});
    }
  }
}

TEST_CASE("sum, mean and max pass gradcheck for every axis pattern") {
  for (const Case& c : cases) {
    CAPTURE(c.shape);
    CAPTURE(list_str(c.axes));
    CAPTURE(c.keepdim);
    for (Kind k : {Kind::sum, Kind::mean, Kind::max}) {
      CAPTURE(name(k));
      // randn values: ties for the maximum have probability zero, so max has no kink nearby.
      CHECK(gradcheck([&](const std::vector<Var<double>>& in) { return reduce(k, in[0], c.axes, c.keepdim); },
                      {randn<double>(c.shape, 3)}));
    }
  }
}

TEST_CASE("sum over two axes keeps dims") {
  const auto x = constant(randn<double>({2, 3, 4}, 1));
  CHECK(sum(x, {0, 2}, true).shape() == Shape{1, 3, 1});
  CHECK(sum(x, {0, 2}).shape() == Shape{3});
}

TEST_CASE("reducing every axis gives rank 0, or all ones with keepdim") {
  const auto x = constant(randn<double>({2, 3, 4}, 1));
  for (Kind k : {Kind::sum, Kind::mean, Kind::max}) {
    CHECK(reduce(k, x, {}, false).shape() == Shape{});
    CHECK(reduce(k, x, {}, true).shape() == Shape{1, 1, 1});
    CHECK(reduce(k, x, {0, 1, 2}, false).value().item() == doctest::Approx(reduce(k, x, {}, false).value().item()));
  }
}

TEST_CASE("negative axes count from the back") {
  const auto x = constant(randn<double>({2, 3, 4}, 1));
  const Tensor<double> by_negative = mean(x, {-1, -3}).value(), by_positive = mean(x, {2, 0}).value();
  CHECK(by_negative.to_vector() == by_positive.to_vector());
}

TEST_CASE("reductions accept lazy expressions") {
  auto a = param(randn<double>({2, 3}, 1)), b = param(randn<double>({2, 3}, 2));
  CHECK(sum(a * b).shape() == Shape{});
  CHECK(mean(a + b, {1}).shape() == Shape{2});
  CHECK(max(a - b, {0}, true).shape() == Shape{1, 3});
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return sum(in[0] * in[1], {0}); },
                  {randn<double>({3, 2}, 3), randn<double>({3, 2}, 4)}));
}

TEST_CASE("max sends the gradient to the first maximum when several tie") {
  Tape tape;
  TapeScope scope(tape);
  SUBCASE("innermost axis") {
    auto x = param(from_vector<double>({1, 3, 3, 2, 5, 5, 5, 0}, {2, 4}));
    backward(max(x, {1}), from_vector<double>({10, 20}, {2}));
    CHECK(x.grad().to_vector() == std::vector<double>{0, 10, 0, 0, 20, 0, 0, 0});
  }
  SUBCASE("a middle axis (inner > 1)") {
    auto x = param(from_vector<double>({1, 7, 4, 7, 4, 2}, {3, 2}));
    backward(max(x, {0}), from_vector<double>({10, 20}, {2}));
    CHECK(x.grad().to_vector() == std::vector<double>{0, 20, 10, 0, 0, 0});
  }
  SUBCASE("non-contiguous axes (first in row-major order of the reduced axes)") {
    auto x = param(from_vector<double>({0, 9, 9, 1, 9, 0, 0, 9}, {2, 2, 2}));
    backward(max(x, {0, 2}), from_vector<double>({10, 20}, {2}));
    CHECK(x.grad().to_vector() == std::vector<double>{0, 10, 20, 0, 0, 0, 0, 0});
  }
}

TEST_CASE("max propagates NaN and sends the gradient to the first NaN") {
  Tape tape;
  TapeScope scope(tape);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto x = param(from_vector<double>({1, nan, nan, 0, 3, 2}, {2, 3}));
  const Var<double> y = max(x, {1});
  CHECK(std::isnan(y.value().flat(0)));
  CHECK(y.value().flat(1) == 3);
  backward(y, from_vector<double>({10, 20}, {2}));
  CHECK(x.grad().to_vector() == std::vector<double>{0, 10, 0, 0, 20, 0});
}

TEST_CASE("over zero elements sum is zero, mean is NaN and max throws") {
  const auto x = constant(Tensor<double>(Shape{2, 0, 3}));
  CHECK(sum(x, {1}).value().to_vector() == std::vector<double>(6, 0.0));
  CHECK(std::isnan(mean(x).value().item()));
  CHECK(sum(x, {0}).shape() == Shape{0, 3});
  CHECK_THROWS_WITH_AS(
      max(x, {1}),
      doctest::Contains("max: cannot take the maximum over zero elements: shape [2, 0, 3] reduced over axes [1]"),
      Error);
  CHECK(max(x, {0}).shape() == Shape{0, 3});
}

TEST_CASE("reduction errors name the op, the axis and the shape") {
  const auto x = constant(randn<double>({2, 3}, 1));
  CHECK_THROWS_WITH_AS(sum(x, {3}), doctest::Contains("sum: axis 3 is out of range for shape [2, 3]"), Error);
  CHECK_THROWS_WITH_AS(max(x, {-3}), doctest::Contains("max: axis -3 is out of range for shape [2, 3]"), Error);
  CHECK_THROWS_WITH_AS(mean(x, {1, -1}), doctest::Contains("mean: axes [1, -1] name axis 1 twice for shape [2, 3]"),
                       Error);
  CHECK_THROWS_WITH_AS(sum(constant(randn<double>({}, 1)), {0}),
                       doctest::Contains("sum: axis 0 is out of range for shape []"), Error);
}

TEST_CASE("large reductions run on the pool and match the naive reduction") {
  // Past the kernel's fixed pieces: 16384-element row chunks, 1024-row column chunks, 512-column blocks.
  const std::vector<Case> large = {{{300, 257}, {}},       {{300, 257}, {0}},  {{300, 257}, {1}},
                                   {{40, 50, 33}, {0, 2}}, {{40, 50, 33}, {1}}, {{2100, 3}, {0}},
                                   {{3, 5, 600}, {1}}};
  for (const Case& c : large) {
    CAPTURE(c.shape);
    CAPTURE(list_str(c.axes));
    const Tensor<double> x = randn<double>(c.shape, 5);
    for (Kind k : {Kind::sum, Kind::mean, Kind::max}) {
      CAPTURE(name(k));
      test::check_close(reduce(k, constant(x), c.axes, false).value(), naive_reduce(k, x, c.axes, false),
                        {1e-10, 1e-10});
    }
  }
  // Gradients of the parallel paths, by cheap random projections.
  const GradcheckOptions fast{.fast_mode = true};
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return max(in[0], {0, 2}); },
                  {randn<double>({40, 50, 33}, 6)}, fast));
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return mean(in[0], {1}); },
                  {randn<double>({300, 257}, 7)}, fast));
}

// Tolerances against a double reference computed from the same rounded inputs: sums accumulate in f32, so the
// result carries one rounding to T plus f32 accumulation error.
template <class T> constexpr test::Tolerance tolerance = {1e-5, 1e-5};
template <> constexpr test::Tolerance tolerance<bf16> = {1e-2, 1e-3};
template <> constexpr test::Tolerance tolerance<f16> = {2e-3, 1e-3};

TEST_CASE_TEMPLATE("reductions in low precision match double, forward and backward", T, float, bf16, f16) {
  const std::vector<Case> low = {
      {{64, 129}, {}}, {{64, 129}, {1}}, {{16, 300, 5}, {1}}, {{6, 5, 7, 4}, {0, 2}, true}, {{9}, {0}}};
  for (const Case& c : low) {
    CAPTURE(c.shape);
    CAPTURE(list_str(c.axes));
    test::check_against_double<T>([&](const auto& x) { return sum(x, c.axes, c.keepdim); }, c.shape, 1, tolerance<T>);
    test::check_against_double<T>([&](const auto& x) { return mean(x, c.axes, c.keepdim); }, c.shape, 2, tolerance<T>);
    test::check_against_double<T>([&](const auto& x) { return max(x, c.axes, c.keepdim); }, c.shape, 3, tolerance<T>);
  }
}

TEST_CASE("reductions give the same bits whatever the thread count") {
  const auto x = constant(randn<float>({3000, 41}, 9));
  auto run = [&](int threads) {
    test::ThreadCount count(threads);
    std::vector<float> out = sum(x).value().to_vector();
    for (const std::vector<int>& axes : {std::vector<int>{0}, {1}}) {
      for (float v : mean(x, axes).value().to_vector()) out.push_back(v);
    }
    return out;
  };
  CHECK(run(1) == run(3));
}

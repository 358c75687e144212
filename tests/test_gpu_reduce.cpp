// Reductions on a GPU: sum, mean and max over every set of axes against the CPU in double, forward and backward;
// large reductions (chunked, two passes), empty ones, ties and NaNs in max, sum_to on device tensors, bitwise
// run-to-run determinism, and the partial-row sums behind the norm's and the MLP's parameter gradients.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "tapegrad/cuda/partial_sums.hpp"
#include "gpu_reference.hpp"
#include "tapegrad/ops/detail/axes.hpp"
#include "tapegrad/ops/detail/broadcast.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::bitwise_equal;
using test::check_against_cpu;
using test::check_close;
using test::gpu;
using test::GpuInput;
using test::Tolerance;

namespace {

const Device host = Device::cpu();

// Against double on the same rounded inputs: sums accumulate in f64 for f32/f64 and round once (half an ulp of T,
// 2^-24 for f32), and in f32 for bf16/f16 before one rounding to T (2^-9 and 2^-12); mean's gradient rounds dy / n
// once. atol covers results near zero and f16's subnormal gradients of long means. max is exact.
template <class T> Tolerance sum_tolerance() {
  if constexpr (std::is_same_v<T, double>) {
    return {1e-12, 1e-12};
  } else if constexpr (std::is_same_v<T, float>) {
    return {1e-6, 1e-6};
  } else if constexpr (std::is_same_v<T, bf16>) {
    return {8e-3, 1e-3};
  } else {
    return {1e-3, 1e-4};
  }
}
constexpr Tolerance exact{0.0, 0.0};

enum class Kind { sum, mean, max };
const char* name(Kind k) { return k == Kind::sum ? "sum" : k == Kind::mean ? "mean" : "max"; }

template <class U> Var<U> reduce(Kind k, const Var<U>& x, const std::vector<int>& axes, bool keepdim) {
  switch (k) {
    case Kind::sum: return sum(x, axes, keepdim);
    case Kind::mean: return mean(x, axes, keepdim);
    case Kind::max: return max(x, axes, keepdim);
  }
  return {};
}

// Checks `kind` over `axes` of an input of `shape` on the GPU against the CPU; returns the GPU run.
template <class T>
test::Run<T> check_reduction(Kind kind, const Shape& shape, const std::vector<int>& axes, bool keepdim,
                             std::uint64_t seed) {
  const std::string what = std::string(name(kind)) + " over " + (axes.empty() ? "all" : list_str(axes)) + " of " +
                           shape.str() + (keepdim ? " keepdim" : "");
  return check_against_cpu<T>(
      what, [&](const auto& v) { return reduce(kind, v[0], axes, keepdim); }, {GpuInput(shape)},
      kind == Kind::max ? exact : sum_tolerance<T>(), seed);
}

// Every non-empty subset of the axes of a rank-`rank` shape, and the empty list (which means all of them).
std::vector<std::vector<int>> axis_subsets(int rank) {
  std::vector<std::vector<int>> subsets = {{}};
  for (int mask = 1; mask < (1 << rank); ++mask) {
    std::vector<int> axes;
    for (int a = 0; a < rank; ++a) {
      if (mask & (1 << a)) axes.push_back(a);
    }
    subsets.push_back(axes);
  }
  return subsets;
}

constexpr Kind kinds[] = {Kind::sum, Kind::mean, Kind::max};

struct Case {
  Shape shape;
  std::vector<int> axes;
};

// Checks sum, mean and max of each case (seeds from `seed` on).
template <class T> void check_cases(const std::vector<Case>& cases, std::uint64_t seed) {
  for (const Case& c : cases) {
    for (const Kind kind : kinds) check_reduction<T>(kind, c.shape, c.axes, false, ++seed);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("sum, mean and max on the GPU match the CPU over every set of axes", T, TAPEGRAD_GPU_DTYPES) {
  // Odd dims; 131 makes reductions over the innermost axis take the block-per-output kernel.
  for (const Shape& shape : {Shape{5, 3, 131}, Shape{3, 5, 7, 9}, Shape{7, 1, 3, 5}}) {
    std::uint64_t seed = 100;
    for (const std::vector<int>& axes : axis_subsets(shape.rank())) {
      for (const Kind kind : kinds) {
        for (const bool keepdim : {false, true}) check_reduction<T>(kind, shape, axes, keepdim, ++seed);
      }
    }
  }
}

TEST_CASE_TEMPLATE("leading, trailing and middle axes reduce on the GPU like on the CPU", T, TAPEGRAD_GPU_DTYPES) {
  check_cases<T>({
                     {{129, 7, 33}, {0}},       // leading: a thread per output, neighbours reading neighbours
                     {{129, 7, 33}, {-1}},      // trailing, short rows
                     {{3, 7, 1000}, {2}},       // trailing, long rows: a block per output
                     {{7, 300, 5}, {1}},        // middle
                     {{1000, 4, 300}, {0, 2}},  // leading and trailing around a kept axis, long rows
                     {{9, 4, 33, 2}, {1, 3}},   // alternating
                     {{1}, {0}},                // a single element
                 },
                 200);
}

TEST_CASE_TEMPLATE("large reductions on the GPU are cut into chunks and still match the CPU", T, TAPEGRAD_GPU_DTYPES) {
  check_cases<T>({
                     {{1000003}, {}},      // to a scalar: blocks over chunks of one row, then a second pass
                     {{4096, 1000}, {0}},  // column sums: threads over chunks of rows, then a second pass
                     {{4096, 1000}, {1}},  // row sums, a block per row
                     {{2, 1000003}, {1}},  // two long rows
                     {{1000003, 3}, {0}},  // three long columns
                 },
                 300);
}

TEST_CASE_TEMPLATE("reductions on the GPU give the same bits on every run", T, float, bf16) {
  const std::vector<Case> cases = {{{1000003}, {}}, {{4096, 1000}, {0}}, {{300, 2000}, {1}}};
  for (const Case& c : cases) {
    for (const Kind kind : kinds) {
      const test::Run<T> first = check_reduction<T>(kind, c.shape, c.axes, false, 400);
      const test::Run<T> second = check_reduction<T>(kind, c.shape, c.axes, false, 400);
      CHECK(bitwise_equal(first.y, second.y));
      CHECK(bitwise_equal(first.grads[0], second.grads[0]));
    }
  }
}

TEST_CASE_TEMPLATE("over zero elements on the GPU sum is zero, mean is NaN and max throws", T, TAPEGRAD_GPU_DTYPES) {
  const Tensor<T> x({3, 0, 2}, gpu);
  const Tensor<T> sums = sum(constant(x), {1}).value().to(host);
  const Tensor<T> means = mean(constant(x), {1}).value().to(host);
  REQUIRE(sums.shape() == Shape{3, 2});
  REQUIRE(means.shape() == Shape{3, 2});
  for (std::int64_t i = 0; i < sums.numel(); ++i) {
    CHECK(convert<double>(sums.flat(i)) == 0.0);
    CHECK(std::isnan(convert<double>(means.flat(i))));
  }
  CHECK(sum(constant(x), {0, 2}).value().shape() == Shape{0});  // no outputs at all
  CHECK_THROWS_WITH_AS(max(constant(x), {1}), doctest::Contains("max: cannot take the maximum over zero elements"),
                       Error);
  // The gradient of an empty mean is empty.
  Tape tape;
  TapeScope scope(tape);
  const Var<T> p = param(x);
  backward(mean(p, {1}), ones<T>({3, 2}, gpu));
  CHECK(p.grad().shape() == x.shape());
}

TEST_CASE_TEMPLATE("max on the GPU sends the gradient to the first of tied maxima, like the CPU",
                   T, TAPEGRAD_GPU_DTYPES) {
  // Values from {-0, 0, 1, 2}: many ties, some between the two zeros, spread across threads, blocks and chunks.
  const std::vector<std::pair<Shape, std::vector<int>>> cases = {
      {{3, 1000}, {1}}, {{1000, 3}, {0}}, {{5, 7, 9}, {0, 2}}, {{64, 64}, {}}};
  for (const auto& [shape, axes] : cases) {
    CAPTURE(shape);
    const Tensor<std::int32_t> picks = rand_int<std::int32_t>(shape, 7, 0, 4);
    Tensor<T> x(shape);
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const int k = picks.flat(i);
      x.flat(i) = convert<T>(k == 0 ? -0.0 : k - 1.0);
    }
    const Tensor<T> dy = randn<T>(max(constant(x), axes).shape(), 8);
    Tensor<T> grads[2], values[2];
    for (const Device device : {host, gpu}) {
      Tape tape;
      TapeScope scope(tape);
      const Var<T> p = param(x.to(device));
      const Var<T> y = max(p, axes);
      backward(y, dy.to(device));
      values[device.is_cpu() ? 0 : 1] = y.value().to(host);
      grads[device.is_cpu() ? 0 : 1] = p.grad().to(host);
    }
    check_close(values[1], cast<double>(values[0]), exact);  // -0 and 0 compare equal
    CHECK(bitwise_equal(grads[1], grads[0]));
  }
}

TEST_CASE_TEMPLATE("max on the GPU propagates NaN and sends the gradient to the first NaN", T, TAPEGRAD_GPU_DTYPES) {
  Tensor<T> x = randn<T>({4, 300}, 9);
  const T nan = convert<T>(NAN);
  x(1, 7) = nan;    // one NaN
  x(2, 5) = nan;    // two in one row: the first takes the gradient
  x(2, 250) = nan;
  const Tensor<T> dy = randn<T>({4}, 10);
  Tape tape;
  TapeScope scope(tape);
  const Var<T> on_host = param(x);
  backward(max(on_host, {1}), dy);
  const Var<T> p = param(x.to(gpu));
  const Var<T> y = max(p, {1});
  backward(y, dy.to(gpu));
  const Tensor<T> values = y.value().to(host), dx = p.grad().to(host);
  CHECK_FALSE(std::isnan(convert<double>(values(0))));
  CHECK(std::isnan(convert<double>(values(1))));
  CHECK(std::isnan(convert<double>(values(2))));
  CHECK_FALSE(std::isnan(convert<double>(values(3))));
  CHECK(bitwise_equal(dx, on_host.grad()));
  CHECK(convert<double>(dx(2, 5)) == convert<double>(dy(2)));
  CHECK(convert<double>(dx(2, 250)) == 0.0);
}

TEST_CASE("reduction errors on the GPU are the CPU's") {
  const Var<float> x = constant(randn<float>({2, 3}, 1).to(gpu));
  CHECK_THROWS_WITH_AS(sum(x, {2}), doctest::Contains("sum"), Error);
  CHECK_THROWS_WITH_AS(mean(x, {0, -2}), doctest::Contains("mean: axes [0, -2] name axis 0 twice"), Error);
  CHECK_THROWS_WITH_AS(max(x, {5}), doctest::Contains("max"), Error);
}

TEST_CASE_TEMPLATE("sum_to on the GPU sums a device gradient down to an operand's shape", T, TAPEGRAD_GPU_DTYPES) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{4, 3, 5}, {3, 1}},      // leading axis dropped, trailing one kept as 1
      {{4, 3, 5}, {5}},         // leading axes dropped
      {{4, 3, 5}, {4, 1, 5}},   // a middle axis
      {{7}, {}},                // to a scalar
      {{512, 1000}, {1000}},    // a bias gradient: long columns
      {{0, 5}, {1, 5}},         // an empty sum is zero
  };
  std::uint64_t seed = 500;
  for (const auto& [from, to] : cases) {
    CAPTURE(from);
    CAPTURE(to);
    const Tensor<T> g = randn<T>(from, ++seed);
    const Tensor<T> got = sum_to(g.to(gpu), to);
    CHECK(got.device() == gpu);
    check_close(got.to(host), sum_to(cast<double>(g), to), sum_tolerance<T>());
  }
  const Tensor<T> same = randn<T>({2, 3}, 1).to(gpu);
  CHECK(sum_to(same, same.shape()).shares_storage_with(same));
  CHECK_THROWS_WITH_AS(sum_to(same, Shape{4}), doctest::Contains("sum_to"), Error);
}

// sum_partials (the second stage of the norm's dγ/dβ and the MLP's bias gradients) on its own: the column sums of
// [rows, width] partials in the compute type against double, for row counts from none to many rows per slice, widths
// within one tile of columns and across several, partials at any element offset, and the same bits on every run.
TEST_CASE_TEMPLATE("sum_partials adds partial rows column by column in a fixed order", T, TAPEGRAD_GPU_DTYPES) {
  using C = compute_t<T>;
  // One rounding to T as for sum (rtol), but the sums run in C: in f32 but for f64, ~1e-5 off at 1000 rows of randn
  // (eight slices of 125 rows, then the slices).
  Tolerance tolerance = sum_tolerance<T>();
  if constexpr (!std::is_same_v<T, double>) tolerance.atol = 1e-4;
  std::uint64_t seed = 900;
  for (const std::int64_t rows : {0, 1, 7, 9, 256, 300, 1000}) {
    for (const std::int64_t width : {1, 6, 8, 1024, 1027}) {
      CAPTURE(rows);
      CAPTURE(width);
      const Tensor<C> values = randn<C>({rows, width}, ++seed);
      Tensor<C> shifted({rows * width + 1});  // values one element into the array
      for (std::int64_t i = 0; i < values.numel(); ++i) shifted.flat(i + 1) = values.flat(i);
      const Tensor<C> aligned_on_gpu = values.to(gpu), shifted_on_gpu = shifted.to(gpu);
      const auto column_sums = [&](const C* partials) {
        Tensor<T> out({width}, gpu);
        const cuda::PartialSums sum{partials, out.data()};
        cuda::sum_partials(dtype_v<T>, {&sum, 1}, rows, width, gpu.index);
        return out.to(host);
      };
      const Tensor<T> got = column_sums(aligned_on_gpu.data());
      check_close(got, sum_to(cast<double>(values), Shape{width}), tolerance);
      CHECK(bitwise_equal(column_sums(shifted_on_gpu.data() + 1), got));
      CHECK(bitwise_equal(column_sums(aligned_on_gpu.data()), got));
    }
  }
  const cuda::PartialSums too_many[cuda::max_partial_sums + 1] = {};
  CHECK_THROWS_WITH_AS(cuda::sum_partials(dtype_v<T>, too_many, 1, 1, gpu.index),
                       "sum_partials: 4 sums in one launch (at most 3)", Error);
}

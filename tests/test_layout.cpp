#include <doctest/doctest.h>

#include <numeric>

#include "reference.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::ravel;
using test::unravel;

namespace {

// permute by index arithmetic: y[i0, ..., ik] = x[j] with j[dims[k]] = i[k].
Tensor<double> naive_permute(const Tensor<double>& x, const std::vector<int>& dims) {
  std::vector<std::int64_t> out_dims;
  for (int d : dims) out_dims.push_back(x.dim(d));
  Tensor<double> y{Shape(out_dims)};
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const auto out = unravel(i, y.shape());
    std::vector<std::int64_t> in(out.size());
    for (std::size_t k = 0; k < dims.size(); ++k) in[static_cast<std::size_t>(dims[k])] = out[k];
    y.flat(i) = x.flat(ravel(in, x.shape()));
  }
  return y;
}

// The indices Python's range(dim)[start:stop:step] holds.
std::vector<std::int64_t> python_indices(std::int64_t dim, std::int64_t start, std::int64_t stop, std::int64_t step) {
  auto clamp = [dim](std::int64_t i) { return i < 0 ? std::max<std::int64_t>(i + dim, 0) : std::min(i, dim); };
  std::vector<std::int64_t> out;
  for (std::int64_t i = clamp(start); i < clamp(stop); i += step) out.push_back(i);
  return out;
}

// x[..., idx, ...] along `axis`, element by element.
Tensor<double> naive_take(const Tensor<double>& x, int axis, const std::vector<std::int64_t>& idx) {
  std::vector<std::int64_t> dims = x.shape().to_vector();
  dims[static_cast<std::size_t>(axis)] = static_cast<std::int64_t>(idx.size());
  Tensor<double> y{Shape(dims)};
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    auto at = unravel(i, y.shape());
    at[static_cast<std::size_t>(axis)] = idx[static_cast<std::size_t>(at[static_cast<std::size_t>(axis)])];
    y.flat(i) = x.flat(ravel(at, x.shape()));
  }
  return y;
}

bool equal(const Tensor<double>& a, const Tensor<double>& b) {
  return a.shape() == b.shape() && a.to_vector() == b.to_vector();
}

}  // namespace

// ---- permute and transpose --------------------------------------------------------------------------------------

TEST_CASE("permute moves every element where index arithmetic says, for ranks 1 to 8") {
  const std::vector<std::pair<Shape, std::vector<int>>> cases = {
      {{7}, {0}},
      {{3, 5}, {1, 0}},
      {{2, 3, 4}, {2, 0, 1}},
      {{2, 3, 4}, {0, 2, 1}},
      {{2, 3, 4}, {1, 0, 2}},          // the innermost axis stays: a copy of rows
      {{4, 1, 5, 3}, {2, 1, 3, 0}},   // size-1 axes drop out
      {{2, 3, 2, 5, 3}, {4, 2, 0, 3, 1}},
      {{2, 3, 2, 2, 3, 2}, {0, 1, 4, 5, 2, 3}},  // merges into a 3-axis permutation
      {{2, 1, 3, 2, 2, 1, 3, 2}, {7, 6, 5, 4, 3, 2, 1, 0}},
      {{37, 70}, {-1, -2}},  // negative dims; more than one 32×32 tile with ragged edges
  };
  for (const auto& [shape, dims] : cases) {
    CAPTURE(shape);
    const Tensor<double> x = randn<double>(shape, 11);
    std::vector<int> normalized;
    for (int d : dims) normalized.push_back(d < 0 ? d + shape.rank() : d);
    CHECK(equal(permute(constant(x), dims).value(), naive_permute(x, normalized)));
  }
}

TEST_CASE("large permutes run on the pool and match index arithmetic") {
  const Tensor<double> x = randn<double>({48, 65, 33}, 3);
  for (const std::vector<int>& dims : {std::vector<int>{2, 0, 1}, {1, 0, 2}, {2, 1, 0}}) {
    CHECK(equal(permute(x, dims), naive_permute(x, dims)));
  }
}

TEST_CASE("a permute that moves no data is a view") {
  const Tensor<double> x = randn<double>({3, 1, 4}, 1);
  const Tensor<double> y = permute(x, {1, 0, 2});
  CHECK(y.shape() == Shape{1, 3, 4});
  CHECK(y.shares_storage_with(x));
}

TEST_CASE("permute and transpose pass gradcheck, up to rank 6") {
  const std::vector<std::pair<Shape, std::vector<int>>> cases = {
      {{4}, {0}}, {{3, 5}, {1, 0}}, {{2, 3, 4}, {2, 0, 1}}, {{2, 3, 1, 2, 3}, {4, 0, 3, 2, 1}},
      {{2, 1, 2, 3, 2, 2}, {5, 3, 1, 0, 2, 4}},
  };
  for (const auto& [shape, dims] : cases) {
    CAPTURE(shape);
    const std::vector<int> d = dims;
    CHECK(gradcheck([d](const std::vector<Var<double>>& in) { return permute(in[0], d); }, {randn<double>(shape, 2)}));
  }
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return transpose(in[0]); }, {randn<double>({2, 3, 5}, 3)}));
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return transpose(in[0], 0, -1); },
                  {randn<double>({4, 3, 2}, 4)}));
}

TEST_CASE("transpose swaps the last two axes by default") {
  const Tensor<double> x = randn<double>({2, 3, 4}, 5);
  const Var<double> y = transpose(constant(x));
  CHECK(y.shape() == Shape{2, 4, 3});
  CHECK(equal(y.value(), naive_permute(x, {0, 2, 1})));
  CHECK(transpose(constant(x), 0, 2).shape() == Shape{4, 3, 2});
}

TEST_CASE("permute and transpose accept lazy expressions") {
  auto a = param(randn<double>({2, 3}, 1)), b = param(randn<double>({2, 3}, 2));
  CHECK(permute(a * b, {1, 0}).shape() == Shape{3, 2});
  CHECK(transpose(a + b).shape() == Shape{3, 2});
}

TEST_CASE("permute and transpose errors name the op, the dims and the shape") {
  const auto x = constant(randn<double>({2, 3, 4}, 1));
  CHECK_THROWS_WITH_AS(permute(x, {0, 1}), doctest::Contains("permute: dims [0, 1] have 2 entries but shape [2, 3, 4]"),
                       Error);
  CHECK_THROWS_WITH_AS(permute(x, {0, 2, -1}),
                       doctest::Contains("permute: axes [0, 2, -1] name axis 2 twice for shape [2, 3, 4]"), Error);
  CHECK_THROWS_WITH_AS(permute(x, {0, 1, 3}), doctest::Contains("permute: axis 3 is out of range for shape [2, 3, 4]"),
                       Error);
  CHECK_THROWS_WITH_AS(transpose(constant(randn<double>({5}, 1))),
                       doctest::Contains("transpose: axis -2 is out of range for shape [5]"), Error);
}

// ---- reshape ---------------------------------------------------------------------------------------------------

TEST_CASE("reshape infers one -1 and shares the input's storage") {
  const auto x = param(randn<double>({2, 3, 4}, 1));
  const Var<double> y = reshape(x, {4, -1});
  CHECK(y.shape() == Shape{4, 6});
  CHECK(y.value().shares_storage_with(x.value()));
  CHECK(reshape(x, {-1}).shape() == Shape{24});
  CHECK(reshape(x, {2, 1, -1, 3}).shape() == Shape{2, 1, 4, 3});
  CHECK(reshape(constant(randn<double>({1, 1}, 2)), {}).shape() == Shape{});
  CHECK(reshape(constant(randn<double>({}, 2)), {1, -1, 1}).shape() == Shape{1, 1, 1});
  CHECK(reshape(constant(Tensor<double>(Shape{0, 3})), {3, 0}).shape() == Shape{3, 0});
}

TEST_CASE("reshape passes gradcheck; its gradient has the input's shape") {
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return reshape(in[0], {3, -1}) * in[1]; },
                  {randn<double>({2, 3, 2}, 1), randn<double>({3, 4}, 2)}));
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return reshape(in[0], {}); }, {randn<double>({1}, 3)}));
  Tape tape;
  TapeScope scope(tape);
  auto x = param(randn<double>({2, 6}, 4));
  backward(reshape(x, {3, 2, 2}), randn<double>({3, 2, 2}, 5));
  CHECK(x.grad().shape() == Shape{2, 6});
}

TEST_CASE("reshape errors name the shapes") {
  const auto x = constant(randn<double>({2, 3}, 1));
  CHECK_THROWS_WITH_AS(reshape(x, {4, -1}), doctest::Contains("reshape: cannot reshape [2, 3] (6 elements) to [4, -1]"),
                       Error);
  CHECK_THROWS_WITH_AS(reshape(x, {5}), doctest::Contains("reshape: cannot reshape [2, 3] (6 elements) to [5]"), Error);
  CHECK_THROWS_WITH_AS(reshape(x, {-1, -1}),
                       doctest::Contains("reshape: only one dimension can be -1, got [-1, -1] for shape [2, 3]"),
                       Error);
  CHECK_THROWS_WITH_AS(reshape(x, {-2, -3}), doctest::Contains("reshape: invalid dimension -2 in [-2, -3]"), Error);
  CHECK_THROWS_WITH_AS(reshape(constant(Tensor<double>(Shape{0, 3})), {0, -1}),
                       doctest::Contains("reshape: cannot reshape [0, 3] (0 elements) to [0, -1]"), Error);
}

// ---- slice -----------------------------------------------------------------------------------------------------

TEST_CASE("slice follows Python's start:stop:step rules") {
  const Tensor<double> x = randn<double>({3, 7, 2}, 1);
  const std::vector<std::array<std::int64_t, 3>> ranges = {
      {0, 7, 1}, {2, 5, 1}, {-3, 7, 1}, {-100, 100, 1}, {1, 7, 2}, {0, 7, 3}, {5, 2, 1},
      {-1, -8, 1}, {6, 7, 5}, {3, 3, 1}, {-5, -1, 2}, {0, 7, 100},
  };
  for (const auto& [start, stop, step] : ranges) {
    CAPTURE(start);
    CAPTURE(stop);
    CAPTURE(step);
    for (int axis : {0, 1, -1}) {
      const int a = axis < 0 ? axis + 3 : axis;
      const Var<double> y = slice(constant(x), axis, start, stop, step);
      CHECK(equal(y.value(), naive_take(x, a, python_indices(x.dim(a), start, stop, step))));
    }
  }
}

TEST_CASE("slice passes gradcheck, with steps and negative bounds") {
  const Tensor<double> x = randn<double>({4, 5, 3}, 2);
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return slice(in[0], 1, 1, 4); }, {x}));
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return slice(in[0], -1, -2, 3); }, {x}));
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return slice(in[0], 0, 0, 4, 3); }, {x}));
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return slice(in[0], 0, 1, 5, 2); },
                  {randn<double>({7}, 3)}));
}

TEST_CASE("an empty slice has a zero-size axis and a zero gradient") {
  Tape tape;
  TapeScope scope(tape);
  auto x = param(randn<double>({2, 4}, 1));
  const Var<double> y = slice(x, 1, 3, 1);
  CHECK(y.shape() == Shape{2, 0});
  backward(y, Tensor<double>(Shape{2, 0}));
  CHECK(equal(x.grad(), zeros<double>({2, 4})));
}

TEST_CASE("slice errors name the op, the axis and the shape") {
  const auto x = constant(randn<double>({2, 3}, 1));
  CHECK_THROWS_WITH_AS(slice(x, 1, 0, 3, 0),
                       doctest::Contains("slice: step must be at least 1, got 0 (slicing axis 1 of shape [2, 3])"),
                       Error);
  CHECK_THROWS_WITH_AS(slice(x, 2, 0, 1), doctest::Contains("slice: axis 2 is out of range for shape [2, 3]"), Error);
}

// ---- concat ----------------------------------------------------------------------------------------------------

TEST_CASE("concat joins along any axis, matching slices of the result") {
  const Tensor<double> a = randn<double>({2, 3, 4}, 1), b = randn<double>({2, 1, 4}, 2);
  const Tensor<double> c = randn<double>({2, 5, 4}, 3);
  const Var<double> y = concat(std::vector{constant(a), constant(b), constant(c)}, 1);
  CHECK(y.shape() == Shape{2, 9, 4});
  CHECK(equal(slice(y, 1, 0, 3).value(), a));
  CHECK(equal(slice(y, 1, 3, 4).value(), b));
  CHECK(equal(slice(y, 1, 4, 9).value(), c));
  const Var<double> z = concat(std::vector{constant(a), constant(a)}, -1);
  CHECK(z.shape() == Shape{2, 3, 8});
  CHECK(equal(slice(z, 2, 4, 8).value(), a));
  CHECK(concat(std::vector{constant(randn<double>({3}, 1))}, 0).shape() == Shape{3});
}

TEST_CASE("concat passes gradcheck and records one node") {
  CHECK(gradcheck(
      [](const std::vector<Var<double>>& in) { return concat(in, 1); },
      {randn<double>({2, 3, 2}, 1), randn<double>({2, 1, 2}, 2), randn<double>({2, 4, 2}, 3)}));
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return concat(in, 0); },
                  {randn<double>({3}, 4), randn<double>({2}, 5)}));
  Tape tape;
  TapeScope scope(tape);
  auto a = param(randn<double>({2, 2}, 1));
  auto b = constant(randn<double>({2, 3}, 2));
  const Var<double> y = concat(std::vector{a, b}, 1);
  CHECK(tape.size() == 1);
  const Tensor<double> dy = randn<double>({2, 5}, 3);
  backward(y, dy);
  CHECK(equal(a.grad(), naive_take(dy, 1, {0, 1})));
  CHECK_FALSE(b.grad().defined());
}

TEST_CASE("concat errors name every mismatching shape") {
  const auto a = constant(randn<double>({2, 3, 4}, 1));
  const auto b = constant(randn<double>({2, 5, 4}, 2));
  const auto c = constant(randn<double>({3, 1, 4}, 3));
  const auto d = constant(randn<double>({2, 3}, 4));
  CHECK_THROWS_WITH_AS(concat(std::vector{a, b, c, d}, 1),
                       doctest::Contains("concat: inputs must have the same shape except along axis 1; input 0 has "
                                         "[2, 3, 4] but input 2 has [3, 1, 4], input 3 has [2, 3]"),
                       Error);
  CHECK_THROWS_WITH_AS(concat(std::vector<Var<double>>{}, 0), doctest::Contains("concat: needs at least one input"),
                       Error);
  CHECK_THROWS_WITH_AS(concat(std::vector{a, b}, 3),
                       doctest::Contains("concat: axis 3 is out of range for shape [2, 3, 4]"), Error);
}

// ---- low precision -------------------------------------------------------------------------------------------

// Layout ops only move values, so in every dtype they must equal the double result on the same rounded values.
TEST_CASE_TEMPLATE("layout ops are exact in every dtype, forward and backward", T, float, bf16, f16) {
  const test::Tolerance exact{0.0, 0.0};
  test::check_against_double<T>([](const auto& x) { return permute(x, {2, 0, 3, 1}); }, {3, 4, 5, 2}, 1, exact);
  test::check_against_double<T>([](const auto& x) { return transpose(x); }, {33, 40}, 2, exact);
  test::check_against_double<T>([](const auto& x) { return reshape(x, {-1, 4}); }, {3, 8}, 3, exact);
  test::check_against_double<T>([](const auto& x) { return slice(x, 1, -5, 9, 2); }, {2, 9, 3}, 4, exact);
  test::check_against_double<T>(
      [](const auto& x) { return concat(std::vector{slice(x, 1, 3, 5), slice(x, 1, 0, 3)}, 1); }, {3, 5}, 5, exact);
}

// Printing tensors and Vars. The expected strings are PyTorch 1.13's output for the same values, with tapegrad's
// differences on purpose: the dtype is always shown, by tapegrad's name (PyTorch omits float32 and int64); shapes
// are written [0, 3] as everywhere in tapegrad (PyTorch: size=(0, 3)); a summarised tensor shows its size too;
// `requires_grad=true` is in C++'s spelling; undefined tensors and Vars exist only here.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <vector>

#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;

namespace {
template <class T> std::string printed(const T& x) {
  std::ostringstream out;
  out << x;
  return out.str();
}

// 0, 1, ..., numel - 1 in `shape`, in T.
template <class T> Tensor<T> counting(const Shape& shape) { return arange<T>(shape.numel()).reshape(shape); }

const Tensor<float> two_by_two = from_vector<float>({0.1234f, -1.5f, 2.0f, 3.0f}, {2, 2});
}  // namespace

TEST_CASE("a 2x2 f32 tensor prints with aligned columns and its dtype") {
  CHECK(printed(two_by_two) ==
        "tensor([[ 0.1234, -1.5000],\n"
        "        [ 2.0000,  3.0000]], dtype=f32)");
  CHECK(to_string(two_by_two) == printed(two_by_two));
}

TEST_CASE("a rank-0 tensor prints its value alone") {
  CHECK(printed(full<float>({}, 1.5)) == "tensor(1.5000, dtype=f32)");
  CHECK(printed(full<std::int64_t>({}, 7)) == "tensor(7, dtype=i64)");
}

TEST_CASE("a rank-3 tensor nests brackets and separates its matrices with a blank line") {
  CHECK(printed(counting<float>({2, 3, 4})) ==
        "tensor([[[ 0.,  1.,  2.,  3.],\n"
        "         [ 4.,  5.,  6.,  7.],\n"
        "         [ 8.,  9., 10., 11.]],\n"
        "\n"
        "        [[12., 13., 14., 15.],\n"
        "         [16., 17., 18., 19.],\n"
        "         [20., 21., 22., 23.]]], dtype=f32)");
  Tensor<double> fractions({2, 3, 4});
  for (std::int64_t i = 0; i < fractions.numel(); ++i) fractions.flat(i) = (static_cast<double>(i) - 11.5) / 4;
  CHECK(printed(fractions) ==
        "tensor([[[-2.8750, -2.6250, -2.3750, -2.1250],\n"
        "         [-1.8750, -1.6250, -1.3750, -1.1250],\n"
        "         [-0.8750, -0.6250, -0.3750, -0.1250]],\n"
        "\n"
        "        [[ 0.1250,  0.3750,  0.6250,  0.8750],\n"
        "         [ 1.1250,  1.3750,  1.6250,  1.8750],\n"
        "         [ 2.1250,  2.3750,  2.6250,  2.8750]]], dtype=f64)");
}

TEST_CASE("a tensor of more than 1000 elements shows the edges of each axis and its size") {
  CHECK(printed(counting<std::int64_t>({40, 50})) ==
        "tensor([[   0,    1,    2,  ...,   47,   48,   49],\n"
        "        [  50,   51,   52,  ...,   97,   98,   99],\n"
        "        [ 100,  101,  102,  ...,  147,  148,  149],\n"
        "        ...,\n"
        "        [1850, 1851, 1852,  ..., 1897, 1898, 1899],\n"
        "        [1900, 1901, 1902,  ..., 1947, 1948, 1949],\n"
        "        [1950, 1951, 1952,  ..., 1997, 1998, 1999]], size=[40, 50], dtype=i64)");
  // The column width comes from the shown values only; the suffixes move to a line of their own past 80 columns.
  Tensor<double> t({40, 50});
  for (std::int64_t i = 0; i < t.numel(); ++i) t.flat(i) = static_cast<double>(i) / 1000 - 1;
  CHECK(printed(t) ==
        "tensor([[-1.0000, -0.9990, -0.9980,  ..., -0.9530, -0.9520, -0.9510],\n"
        "        [-0.9500, -0.9490, -0.9480,  ..., -0.9030, -0.9020, -0.9010],\n"
        "        [-0.9000, -0.8990, -0.8980,  ..., -0.8530, -0.8520, -0.8510],\n"
        "        ...,\n"
        "        [ 0.8500,  0.8510,  0.8520,  ...,  0.8970,  0.8980,  0.8990],\n"
        "        [ 0.9000,  0.9010,  0.9020,  ...,  0.9470,  0.9480,  0.9490],\n"
        "        [ 0.9500,  0.9510,  0.9520,  ...,  0.9970,  0.9980,  0.9990]],\n"
        "       size=[40, 50], dtype=f64)");
  // 1 to 1999 span more than a factor 1000: scientific notation, and rows too wide for 80 columns wrap.
  CHECK(printed(counting<float>({40, 50})) ==
        "tensor([[0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 4.7000e+01, 4.8000e+01,\n"
        "         4.9000e+01],\n"
        "        [5.0000e+01, 5.1000e+01, 5.2000e+01,  ..., 9.7000e+01, 9.8000e+01,\n"
        "         9.9000e+01],\n"
        "        [1.0000e+02, 1.0100e+02, 1.0200e+02,  ..., 1.4700e+02, 1.4800e+02,\n"
        "         1.4900e+02],\n"
        "        ...,\n"
        "        [1.8500e+03, 1.8510e+03, 1.8520e+03,  ..., 1.8970e+03, 1.8980e+03,\n"
        "         1.8990e+03],\n"
        "        [1.9000e+03, 1.9010e+03, 1.9020e+03,  ..., 1.9470e+03, 1.9480e+03,\n"
        "         1.9490e+03],\n"
        "        [1.9500e+03, 1.9510e+03, 1.9520e+03,  ..., 1.9970e+03, 1.9980e+03,\n"
        "         1.9990e+03]], size=[40, 50], dtype=f32)");
}

TEST_CASE("bf16, i64 and f8e4m3 tensors print their values and dtype") {
  CHECK(printed(cast<bf16>(two_by_two)) ==  // 0.1234 rounds to 0.12353515625 in bf16
        "tensor([[ 0.1235, -1.5000],\n"
        "        [ 2.0000,  3.0000]], dtype=bf16)");
  CHECK(printed(from_vector<std::int64_t>({1, -20, 300}, {3})) == "tensor([  1, -20, 300], dtype=i64)");
  CHECK(printed(from_vector<std::int32_t>({1, -20, 300}, {3})) == "tensor([  1, -20, 300], dtype=i32)");
  // i64 values are printed exactly, not through double.
  CHECK(printed(from_vector<std::int64_t>({std::numeric_limits<std::int64_t>::max()}, {1})) ==
        "tensor([9223372036854775807], dtype=i64)");
  const Tensor<f8e4m3> fp8 = cast<f8e4m3>(from_vector<float>({0.5f, -1.75f, 448.0f, 3.0f}, {4}));
  CHECK(printed(fp8) == "tensor([  0.5000,  -1.7500, 448.0000,   3.0000], dtype=f8e4m3)");
  CHECK(printed(cast<f8e5m2>(from_vector<float>({1.0f, -2.0f}, {2}))) == "tensor([ 1., -2.], dtype=f8e5m2)");
  CHECK(printed(cast<f16>(full<float>({1}, 0.25))) == "tensor([0.2500], dtype=f16)");
}

TEST_CASE("precision, edgeitems, threshold and linewidth change the layout as in PyTorch") {
  CHECK(to_string(two_by_two, {.precision = 2}) ==
        "tensor([[ 0.12, -1.50],\n"
        "        [ 2.00,  3.00]], dtype=f32)");
  CHECK(to_string(two_by_two, {.precision = 0}) ==
        "tensor([[ 0, -2],\n"
        "        [ 2,  3]], dtype=f32)");
  CHECK(to_string(arange<std::int64_t>(10), {.threshold = 5, .edgeitems = 2}) ==
        "tensor([0, 1,  ..., 8, 9], size=[10], dtype=i64)");
  Tensor<float> halves = counting<float>({4, 5});
  for (float& v : halves.span()) v += 0.5f;
  CHECK(to_string(halves, {.threshold = 5, .edgeitems = 1}) ==
        "tensor([[ 0.5000,  ...,  4.5000],\n"
        "        ...,\n"
        "        [15.5000,  ..., 19.5000]], size=[4, 5], dtype=f32)");
  // Summarising applies only past the threshold, and hides nothing on axes of at most 2·edgeitems.
  CHECK(to_string(arange<std::int64_t>(10), {.edgeitems = 2}) ==
        "tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], dtype=i64)");
  CHECK(to_string(counting<std::int64_t>({2, 2}), {.threshold = 1}) ==
        "tensor([[0, 1],\n"
        "        [2, 3]], dtype=i64)");
  CHECK(to_string(counting<std::int64_t>({2000}), {.threshold = 2000}).find("...") == std::string::npos);

  Tensor<double> thirds({10});
  for (std::int64_t i = 0; i < 10; ++i) thirds.flat(i) = static_cast<double>(i) / 3;
  CHECK(to_string(thirds, {.linewidth = 50}) ==
        "tensor([0.0000, 0.3333, 0.6667, 1.0000, 1.3333,\n"
        "        1.6667, 2.0000, 2.3333, 2.6667, 3.0000],\n"
        "       dtype=f64)");
  CHECK(printed(counting<float>({30})) ==
        "tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,\n"
        "        14., 15., 16., 17., 18., 19., 20., 21., 22., 23., 24., 25., 26., 27.,\n"
        "        28., 29.], dtype=f32)");

  CHECK_THROWS_WITH_AS(to_string(two_by_two, {.precision = -1}), "to_string: precision is -1; it must be 0 or more",
                       Error);
  CHECK_THROWS_WITH_AS(to_string(two_by_two, {.edgeitems = -2}), "to_string: edgeitems is -2; it must be 0 or more",
                       Error);
}

TEST_CASE("the notation follows PyTorch: whole numbers, fixed, or scientific for the whole tensor") {
  CHECK(printed(zeros<float>({3})) == "tensor([0., 0., 0.], dtype=f32)");
  CHECK(printed(from_vector<double>({1e-5, 1.0, -2.5}, {3})) ==
        "tensor([ 1.0000e-05,  1.0000e+00, -2.5000e+00], dtype=f64)");
  CHECK(printed(from_vector<double>({1.5e9, 1.0}, {2})) == "tensor([1.5000e+09, 1.0000e+00], dtype=f64)");
  CHECK(printed(from_vector<float>({-0.0f, 1.5f}, {2})) == "tensor([-0.0000, 1.5000], dtype=f32)");
}

TEST_CASE("nan and infinities print as nan, inf and -inf") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  CHECK(printed(from_vector<float>({1.5f, nan, inf, -inf}, {4})) ==
        "tensor([1.5000,    nan,    inf,   -inf], dtype=f32)");
  CHECK(printed(from_vector<float>({1.0f, -nan, -inf}, {3})) == "tensor([1., nan, -inf], dtype=f32)");
  CHECK(printed(full<float>({}, nan)) == "tensor(nan, dtype=f32)");
}

TEST_CASE("an empty tensor prints [] with its size unless it has rank 1") {
  CHECK(printed(zeros<float>({0, 3})) == "tensor([], size=[0, 3], dtype=f32)");
  CHECK(printed(zeros<std::int32_t>({0})) == "tensor([], dtype=i32)");
}

TEST_CASE("an undefined tensor or Var prints as undefined instead of throwing") {
  CHECK(printed(Tensor<float>()) == "tensor(undefined)");
  CHECK(printed(Var<float>()) == "var(undefined)");
}

TEST_CASE("a Var prints its value, and requires_grad=true when it requires a gradient") {
  const Tensor<float> v = from_vector<float>({1.5f, 2.0f}, {2});
  CHECK(printed(param(v)) == "tensor([1.5000, 2.0000], dtype=f32, requires_grad=true)");
  CHECK(printed(constant(v)) == "tensor([1.5000, 2.0000], dtype=f32)");
  CHECK(to_string(param(v), {.precision = 1}) == "tensor([1.5, 2.0], dtype=f32, requires_grad=true)");
}

TEST_CASE("the README's printing example prints what the README shows") {
  Tensor<float> t = from_vector<float>({0.1234f, -1.5f, 2.0f, 3.0f}, {2, 2});
  CHECK(printed(t) ==
        "tensor([[ 0.1234, -1.5000],\n"
        "        [ 2.0000,  3.0000]], dtype=f32)");
  CHECK(to_string(t, {.precision = 2}) == "tensor([[ 0.12, -1.50],\n        [ 2.00,  3.00]], dtype=f32)");
}

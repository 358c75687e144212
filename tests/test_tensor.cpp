#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;

TEST_CASE("shapes of rank 0 to 8 keep their dims") {
  std::vector<std::int64_t> dims;
  for (int rank = 0; rank <= Shape::max_rank; ++rank) {
    CAPTURE(rank);
    const Shape s(dims);
    CHECK(s.rank() == rank);
    CHECK(s.to_vector() == dims);
    std::int64_t numel = 1;
    for (std::int64_t d : dims) numel *= d;
    CHECK(s.numel() == numel);
    dims.push_back(rank + 1);
  }
  CHECK(Shape{}.rank() == 0);
  CHECK(Shape{}.numel() == 1);
  CHECK(Shape{}.str() == "[]");
  CHECK(Shape{2, 3}.str() == "[2, 3]");
  CHECK(Shape{4, 0, 5}.numel() == 0);
}

TEST_CASE("rank 9 throws naming the rank and the dims") {
  CHECK_THROWS_WITH_AS(Shape({1, 2, 3, 4, 5, 6, 7, 8, 9}),
                       "shape: rank 9 of [1, 2, 3, 4, 5, 6, 7, 8, 9] exceeds the maximum rank 8", Error);
  const std::vector<std::int64_t> nine(9, 1);
  CHECK_THROWS_AS(Tensor<float>(Shape(nine)), Error);
}

TEST_CASE("negative dims throw naming the shape") {
  CHECK_THROWS_WITH_AS(Shape({2, -1}), doctest::Contains("shape: negative dimension in [2, -1]"), Error);
  CHECK_THROWS_AS(Shape(std::vector<std::int64_t>{-3}), Error);
}

TEST_CASE("axes count from the back when negative and throw when out of range") {
  const Shape s{2, 3, 5};
  CHECK(s.dim(0) == 2);
  CHECK(s.dim(-1) == 5);
  CHECK(s.dim(-3) == 2);
  CHECK_THROWS_WITH_AS(s.dim(3, "sum"), "sum: axis 3 is out of range for shape [2, 3, 5] of rank 3", Error);
  CHECK_THROWS_WITH_AS(s.dim(-4), doctest::Contains("axis -4 is out of range for shape [2, 3, 5]"), Error);
  CHECK_THROWS_AS(Shape{}.dim(0), Error);
}

TEST_CASE("strides are row-major in elements") {
  const auto s = Shape{2, 3, 4}.strides();
  CHECK(s[0] == 12);
  CHECK(s[1] == 4);
  CHECK(s[2] == 1);
  CHECK(Shape{7}.strides()[0] == 1);
}

TEST_CASE("broadcast_shapes follows NumPy and names both shapes when it cannot") {
  CHECK(broadcast_shapes({3, 1}, {1, 4}, "add") == Shape{3, 4});
  CHECK(broadcast_shapes({}, {2, 3}, "add") == Shape{2, 3});
  CHECK(broadcast_shapes({5, 1, 3}, {4, 1}, "add") == Shape{5, 4, 3});
  CHECK_THROWS_WITH_AS(broadcast_shapes({2, 3}, {4, 3}, "add"),
                       "add: shapes [2, 3] and [4, 3] cannot be broadcast together", Error);
}

TEST_CASE("tensors index by multi-index and flat index, row-major") {
  Tensor<float> t = arange<float>(24).reshape({2, 3, 4});
  CHECK(t.rank() == 3);
  CHECK(t.numel() == 24);
  CHECK(t.dim(-1) == 4);
  CHECK(t(0, 0, 0) == 0.0f);
  CHECK(t(1, 2, 3) == 23.0f);
  CHECK(t(1, 0, 2) == 14.0f);
  t(0, 1, 1) = -5.0f;
  CHECK(t.flat(5) == -5.0f);
  CHECK(t.span().size() == 24);
  CHECK(t.to_vector()[5] == -5.0f);
}

TEST_CASE("an index out of range or of the wrong count throws naming the axis and shape") {
  const Tensor<float> t = zeros<float>({2, 3});
  CHECK_THROWS_WITH_AS(t(0, 3), "index: index 3 is out of range for axis 1 of shape [2, 3]", Error);
  CHECK_THROWS_WITH_AS(t(-1, 0), "index: index -1 is out of range for axis 0 of shape [2, 3]", Error);
  CHECK_THROWS_WITH_AS(t(0), "index: got 1 indices for a tensor of shape [2, 3]", Error);
  CHECK_THROWS_WITH_AS(t(0, 0, 0), doctest::Contains("got 3 indices"), Error);
}

TEST_CASE("item reads a one-element tensor and refuses others") {
  CHECK(full<double>({}, 2.5).item() == 2.5);
  CHECK(full<double>({1, 1}, -1.0).item() == -1.0);
  CHECK_THROWS_WITH_AS(zeros<float>({2, 2}).item(), "item: tensor of shape [2, 2] has 4 elements, not 1", Error);
}

TEST_CASE("a default tensor is undefined") {
  const Tensor<float> t;
  CHECK_FALSE(t.defined());
  CHECK(t.rank() == 0);
  CHECK(zeros<float>({0}).defined());
}

TEST_CASE("reshape gives a view on the same storage") {
  Tensor<double> t = arange<double>(6);
  Tensor<double> v = t.reshape({2, 3});
  CHECK(v.shape() == Shape{2, 3});
  CHECK(v.shares_storage_with(t));
  v(1, 2) = 100.0;
  CHECK(t.flat(5) == 100.0);
}

TEST_CASE("reshape to a different element count throws naming both shapes") {
  const Tensor<float> t = zeros<float>({2, 3});
  CHECK_THROWS_WITH_AS(t.reshape({4, 2}), "reshape: cannot view shape [2, 3] (6 elements) as [4, 2] (8 elements)",
                       Error);
  CHECK_THROWS_AS(t.reshape({}), Error);
  CHECK(t.reshape({6, 1}).shape() == Shape{6, 1});
}

TEST_CASE("clone copies the data") {
  Tensor<float> t = arange<float>(4);
  Tensor<float> c = t.clone();
  CHECK_FALSE(c.shares_storage_with(t));
  c.flat(0) = 9.0f;
  CHECK(t.flat(0) == 0.0f);
  CHECK(c.to_vector() == std::vector<float>{9, 1, 2, 3});
  Tensor<float> copy = t;  // copies are handles to the same storage
  CHECK(copy.shares_storage_with(t));
}

// ---- casts and rounding --------------------------------------------------------------------------------------

namespace {
// 1 + k·2^-e, exactly.
double one_plus(int k, int e) { return 1.0 + k * std::ldexp(1.0, -e); }
template <class T> double as_double(T v) { return convert<double>(v); }
}  // namespace

TEST_CASE("casting to bf16 rounds ties to even") {
  // bf16 has 7 fraction bits: between 1 and 2 its values are 1 + k·2^-7.
  CHECK(as_double(convert<bf16>(static_cast<float>(one_plus(1, 8)))) == 1.0);               // tie, 1 is even
  CHECK(as_double(convert<bf16>(static_cast<float>(one_plus(3, 8)))) == one_plus(2, 7));    // tie, rounds up to even
  CHECK(as_double(convert<bf16>(static_cast<float>(-one_plus(3, 8)))) == -one_plus(2, 7));  // negative tie
  CHECK(as_double(convert<bf16>(static_cast<float>(one_plus(1, 8) + std::ldexp(1.0, -20)))) == one_plus(1, 7));
  CHECK(as_double(convert<bf16>(static_cast<float>(one_plus(1, 8) - std::ldexp(1.0, -20)))) == 1.0);
  // Through a tensor cast.
  const Tensor<float> t = from_vector<float>({static_cast<float>(one_plus(1, 8)), static_cast<float>(one_plus(3, 8)),
                                              static_cast<float>(one_plus(5, 8))},
                                             {3});
  const Tensor<bf16> b = cast<bf16>(t);
  CHECK(as_double(b.flat(0)) == 1.0);
  CHECK(as_double(b.flat(1)) == one_plus(2, 7));
  CHECK(as_double(b.flat(2)) == one_plus(2, 7));  // 1 + 5·2^-8 lies between 1 + 2·2^-7 and 1 + 3·2^-7: even is 2
}

TEST_CASE("casting to f16 rounds ties to even") {
  // f16 has 10 fraction bits: between 1 and 2 its values are 1 + k·2^-10.
  CHECK(as_double(convert<f16>(static_cast<float>(one_plus(1, 11)))) == 1.0);
  CHECK(as_double(convert<f16>(static_cast<float>(one_plus(3, 11)))) == one_plus(2, 10));
  CHECK(as_double(convert<f16>(static_cast<float>(-one_plus(3, 11)))) == -one_plus(2, 10));
  CHECK(as_double(convert<f16>(2048.0f + 1.0f)) == 2048.0);  // ulp 2 above 2048: 2049 is a tie, 2048 even
  CHECK(as_double(convert<f16>(2048.0f + 3.0f)) == 2052.0);
  CHECK(std::isinf(as_double(convert<f16>(70000.0f))));
}

TEST_CASE_TEMPLATE("casting from double rounds once, not through f32", T, bf16, f16) {
  // Just above a tie of T by less than an f32 ulp: rounding to f32 first would land on the tie and then round down.
  const int fraction_bits = std::is_same_v<T, bf16> ? 7 : 10;
  const double above_tie = one_plus(1, fraction_bits + 1) + std::ldexp(1.0, -40);
  const double below_tie = one_plus(1, fraction_bits + 1) - std::ldexp(1.0, -40);
  CHECK(as_double(convert<T>(above_tie)) == one_plus(1, fraction_bits));
  CHECK(as_double(convert<T>(below_tie)) == 1.0);
  CHECK(as_double(convert<T>(-above_tie)) == -one_plus(1, fraction_bits));
  CHECK(as_double(cast<T>(from_vector<double>({above_tie}, {1})).flat(0)) == one_plus(1, fraction_bits));
  // Exact values, zeros, infinities and NaN pass through.
  CHECK(as_double(convert<T>(0.375)) == 0.375);
  CHECK(std::signbit(as_double(convert<T>(-0.0))));
  CHECK(as_double(convert<T>(std::numeric_limits<double>::infinity())) == std::numeric_limits<double>::infinity());
  CHECK(std::isnan(as_double(convert<T>(std::numeric_limits<double>::quiet_NaN()))));
}

TEST_CASE("casting to f32 from double rounds to nearest even") {
  CHECK(convert<float>(one_plus(1, 24)) == 1.0f);
  CHECK(convert<float>(one_plus(3, 24)) == static_cast<float>(one_plus(2, 23)));
}

TEST_CASE_TEMPLATE("cast keeps the shape and widening is exact", T, float, double, bf16, f16) {
  const Tensor<T> t = randn<T>({3, 5}, 7);
  const Tensor<double> wide = cast<double>(t);
  CHECK(wide.shape() == t.shape());
  for (std::int64_t i = 0; i < t.numel(); ++i) CHECK(convert<T>(wide.flat(i)) == t.flat(i));
  const Tensor<T> back = cast<T>(wide);
  for (std::int64_t i = 0; i < t.numel(); ++i) CHECK(back.flat(i) == t.flat(i));
}

// ---- factories -----------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("zeros, ones, full and arange fill as named", T, float, double, bf16, f16, std::int32_t,
                   std::int64_t) {
  const Shape shape{2, 3};
  const Tensor<T> z = zeros<T>(shape), o = ones<T>(shape);
  for (const T v : z.span()) CHECK(v == T(0));
  for (const T v : o.span()) CHECK(v == T(1));
  const Tensor<T> f = full<T>(shape, 3.0);
  CHECK(f.shape() == shape);
  for (const T v : f.span()) CHECK(v == T(3));
  const Tensor<T> a = arange<T>(5);
  CHECK(a.shape() == Shape{5});
  for (std::int64_t i = 0; i < 5; ++i) CHECK(a.flat(i) == T(i));
  CHECK(arange<T>(0).numel() == 0);
  CHECK(Tensor<T>::dtype() == dtype_v<T>);
}

TEST_CASE("full rounds its value to the dtype") {
  CHECK(as_double(full<bf16>({}, one_plus(3, 8)).item()) == one_plus(2, 7));
  CHECK(full<std::int32_t>({}, 7.0).item() == 7);
}

TEST_CASE("arange of a negative length throws") {
  CHECK_THROWS_WITH_AS(arange<float>(-2), "arange: length must be non-negative, got -2", Error);
}

TEST_CASE("from_vector copies values and refuses the wrong count") {
  std::vector<double> values{1, 2, 3, 4, 5, 6};
  const Tensor<double> t = from_vector(values, {3, 2});
  values[0] = 100;
  CHECK(t(0, 0) == 1.0);
  CHECK(t(2, 1) == 6.0);
  CHECK_THROWS_WITH_AS(from_vector<double>({1, 2, 3, 4, 5}, {2, 3}),
                       "from_vector: got 5 values for shape [2, 3] which holds 6", Error);
  CHECK(from_vector<float>({4.0f}, {}).item() == 4.0f);
}

TEST_CASE("dtype names and sizes") {
  CHECK(dtype_name(DType::f32) == "f32");
  CHECK(dtype_name(DType::f64) == "f64");
  CHECK(dtype_name(DType::bf16) == "bf16");
  CHECK(dtype_name(DType::f16) == "f16");
  CHECK(dtype_name(DType::i32) == "i32");
  CHECK(dtype_name(DType::i64) == "i64");
  CHECK(dtype_size(DType::f32) == 4);
  CHECK(dtype_size(DType::f64) == 8);
  CHECK(dtype_size(DType::bf16) == 2);
  CHECK(dtype_size(DType::f16) == 2);
  CHECK(dtype_size(DType::i32) == 4);
  CHECK(dtype_size(DType::i64) == 8);
  CHECK(dtype_size(dtype_v<bf16>) == sizeof(bf16));
  CHECK(dtype_size(dtype_v<f16>) == sizeof(f16));
  static_assert(dtype_v<float> == DType::f32 && dtype_v<double> == DType::f64);
  static_assert(std::is_same_v<compute_t<bf16>, float> && std::is_same_v<compute_t<f16>, float>);
  static_assert(std::is_same_v<compute_t<double>, double>);
  static_assert(is_float_dtype_v<bf16> && !is_float_dtype_v<std::int32_t>);
}

TEST_CASE("a shape whose dimensions multiply past 2^63 - 1 is refused naming it") {
  const std::int64_t big = std::int64_t{1} << 32;
  CHECK_THROWS_WITH_AS(Shape({big, big}),
                       "shape: the dimensions [4294967296, 4294967296] multiply to more than 2^63 - 1 elements, which "
                       "an int64 cannot count",
                       Error);
  CHECK_THROWS_WITH_AS(Shape({3, std::int64_t{1} << 62}), doctest::Contains("[3, 4611686018427387904] multiply"),
                       Error);
  // Empty, but its strides would still overflow.
  CHECK_THROWS_WITH_AS(Shape({0, big, big}), doctest::Contains("multiply to more than 2^63 - 1"), Error);
  CHECK(Shape({big, big / 2 - 1}).numel() == big * (big / 2 - 1));
  CHECK(Shape({0, big}).numel() == 0);
  CHECK_THROWS_WITH_AS(Tensor<float>({0}).reshape({big, big}), doctest::Contains("shape: the dimensions"), Error);
}

TEST_CASE("a tensor of more than 2^63 - 1 bytes is refused naming the factory, the shape and the dtype") {
  const Shape huge{std::int64_t{1} << 62};  // 2^62 elements: 2^64 bytes of f32
  const std::string bytes = " would take 4611686018427387904 × 4 bytes, more than the 2^63 - 1 bytes that memory can "
                            "address";
  CHECK_THROWS_WITH_AS(zeros<float>(huge), ("zeros: a tensor of shape [4611686018427387904] and dtype f32" + bytes).c_str(),
                       Error);
  CHECK_THROWS_WITH_AS(ones<float>(huge), doctest::Contains("ones: a tensor of shape [4611686018427387904]"), Error);
  CHECK_THROWS_WITH_AS(full<float>(huge, 2), doctest::Contains("full: a tensor of shape"), Error);
  CHECK_THROWS_WITH_AS(randn<float>(huge, 1), doctest::Contains("randn: a tensor of shape"), Error);
  CHECK_THROWS_WITH_AS(rand_uniform<float>(huge, 1), doctest::Contains("rand_uniform: a tensor of shape"), Error);
  CHECK_THROWS_WITH_AS(rand_int<std::int64_t>(huge, 1, 0, 2), doctest::Contains("rand_int: a tensor of shape"), Error);
  CHECK_THROWS_WITH_AS(Tensor<float>{huge}, ("Tensor: a tensor of shape [4611686018427387904] and dtype f32" + bytes).c_str(),
                       Error);
  CHECK_THROWS_WITH_AS(Tensor<double>({std::int64_t{1} << 60}), doctest::Contains("dtype f64 would take"), Error);
  CHECK(zeros<float>({4}).numel() == 4);  // and the next tensor is made as usual
}

TEST_CASE("reading an undefined tensor throws naming the access") {
  const Tensor<float> none;
  CHECK_FALSE(none.defined());
  CHECK_THROWS_WITH_AS(none.flat(0), "flat: the tensor is undefined (a default-constructed Tensor, with no storage)",
                       Error);
  CHECK_THROWS_WITH_AS(none.item(), doctest::Contains("item: the tensor is undefined"), Error);
  CHECK_THROWS_WITH_AS(none.span(), doctest::Contains("span: the tensor is undefined"), Error);
  CHECK_THROWS_WITH_AS(none.to_vector(), doctest::Contains("to_vector: the tensor is undefined"), Error);
  CHECK_THROWS_WITH_AS(none(0), doctest::Contains("index: the tensor is undefined"), Error);
  CHECK_THROWS_WITH_AS(cast<double>(none), doctest::Contains("cast: the tensor is undefined"), Error);
  CHECK_FALSE(none.clone().defined());
}

TEST_CASE("a flat index out of range throws naming the index and the shape") {
  Tensor<float> t = zeros<float>({2, 3});
  CHECK_THROWS_WITH_AS(t.flat(6), "flat: index 6 is out of range for a tensor of shape [2, 3] (6 elements)", Error);
  CHECK_THROWS_WITH_AS(std::as_const(t).flat(-1), doctest::Contains("flat: index -1 is out of range"), Error);
  CHECK_THROWS_AS(Tensor<double>({0}).flat(0), Error);
  t.flat(5) = 1.0f;
  CHECK(t(1, 2) == 1.0f);
}

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "support.hpp"
#include "tapegrad/tapegrad.hpp"
#include "tapegrad/tensor/core/detail/philox.hpp"

using namespace tapegrad;
using test::bitwise_equal;
using test::moments;
using test::Moments;
using test::ThreadCount;

namespace {

template <class T> std::int64_t count_equal(const Tensor<T>& a, const Tensor<T>& b) {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) n += a.flat(i) == b.flat(i);
  return n;
}

}  // namespace

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors") {
  struct Kat {
    philox::Block counter;
    philox::Key key;
    philox::Block expected;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, {{0, 0}}, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       {{0xffffffff, 0xffffffff}},
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       {{0xa4093822, 0x299f31d0}},
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat& kat : kats) {
    const philox::Block out = philox::philox4x32_10(kat.counter, kat.key);
    for (int i = 0; i < 4; ++i) CHECK(out.w[i] == kat.expected.w[i]);
  }
}

TEST_CASE("block maps the seed to the key and (index, stream) to the counter") {
  const std::uint64_t seed = 0x0123456789abcdefull, index = 0xfedcba9876543210ull;
  const philox::Block expected =
      philox::philox4x32_10({{0x76543210u, 0xfedcba98u, 7u, 0u}}, {{0x89abcdefu, 0x01234567u}});
  const philox::Block out = philox::block(seed, index, 7);
  for (int i = 0; i < 4; ++i) CHECK(out.w[i] == expected.w[i]);
  // The first known-answer vector through the public mapping.
  CHECK(philox::block(0, 0, 0).w[0] == 0x6627e8d5u);
}

TEST_CASE("the same seed gives the same values, different seeds differ") {
  const Shape shape{37, 29};
  CHECK(bitwise_equal(randn<float>(shape, 5), randn<float>(shape, 5)));
  CHECK(bitwise_equal(rand_uniform<float>(shape, 5), rand_uniform<float>(shape, 5)));
  CHECK(bitwise_equal(rand_int<std::int32_t>(shape, 5, 0, 1000), rand_int<std::int32_t>(shape, 5, 0, 1000)));
  // Almost every element changes with the seed (rand_int over 1000 values collides now and then).
  CHECK(count_equal(randn<float>(shape, 5), randn<float>(shape, 6)) == 0);
  CHECK(count_equal(rand_uniform<float>(shape, 5), rand_uniform<float>(shape, 6)) < 3);
  CHECK(count_equal(rand_int<std::int32_t>(shape, 5, 0, 1000), rand_int<std::int32_t>(shape, 6, 0, 1000)) < 10);
}

TEST_CASE("element i depends on the seed and i alone, not on the shape") {
  const Tensor<float> small = randn<float>({10}, 9), large = randn<float>({4, 250}, 9);
  for (std::int64_t i = 0; i < small.numel(); ++i) CHECK(small.flat(i) == large.flat(i));
}

TEST_CASE_TEMPLATE("every dtype holds the f32 values of the seed, rounded", T, double, bf16, f16) {
  const Shape shape{1001};
  const double high = 5.0;
  const Tensor<float> n32 = randn<float>(shape, 11, 0.5, 2.0), u32 = rand_uniform<float>(shape, 11, -3.0, high);
  const Tensor<T> n = randn<T>(shape, 11, 0.5, 2.0), u = rand_uniform<T>(shape, 11, -3.0, high);
  for (std::int64_t i = 0; i < shape.numel(); ++i) {
    CHECK(n.flat(i) == convert<T>(n32.flat(i)));
    const T rounded = convert<T>(u32.flat(i));
    if (convert<double>(rounded) < high) {
      CHECK(u.flat(i) == rounded);
    } else {  // rounding reached `high`: the value steps back to just below it
      CHECK(convert<double>(u.flat(i)) < high);
      CHECK(convert<double>(u.flat(i)) > high - 0.04);
    }
  }
}

TEST_CASE("rand_int gives the same values as i32 and i64") {
  const Tensor<std::int32_t> a = rand_int<std::int32_t>({513}, 3, -50, 50);
  const Tensor<std::int64_t> b = rand_int<std::int64_t>({513}, 3, -50, 50);
  for (std::int64_t i = 0; i < a.numel(); ++i) CHECK(std::int64_t{a.flat(i)} == b.flat(i));
}

TEST_CASE("random tensors do not depend on the thread count") {
  const Shape shape{301, 1003};  // large enough to be split across the pool
  auto draw = [&](int threads) {
    ThreadCount scope(threads);
    return std::make_tuple(randn<float>(shape, 21), rand_uniform<float>(shape, 21, -1.0, 1.0),
                           rand_int<std::int64_t>(shape, 21, 0, 1 << 20), randn<bf16>(shape, 21));
  };
  const auto one = draw(1);
  for (int threads : {2, 4}) {
    CAPTURE(threads);
    const auto many = draw(threads);
    CHECK(bitwise_equal(std::get<0>(one), std::get<0>(many)));
    CHECK(bitwise_equal(std::get<1>(one), std::get<1>(many)));
    CHECK(bitwise_equal(std::get<2>(one), std::get<2>(many)));
    CHECK(bitwise_equal(std::get<3>(one), std::get<3>(many)));
  }
}

TEST_CASE("a million normals have mean 0 and standard deviation 1") {
  // Standard errors: 1e-3 for the mean, 7e-4 for the deviation; allow about five of them.
  const Moments m = moments(randn<float>({1000, 1000}, 1));
  CHECK(std::abs(m.mean) < 5e-3);
  CHECK(std::abs(m.stddev - 1.0) < 4e-3);
  // Box-Muller from 24-bit uniforms reaches about 5.8 sigma; a million draws go past 4 on both sides.
  CHECK(m.min < -4.0);
  CHECK(m.max > 4.0);

  const Moments shifted = moments(randn<double>({1000, 1000}, 2, 3.0, 0.5));
  CHECK(std::abs(shifted.mean - 3.0) < 2.5e-3);
  CHECK(std::abs(shifted.stddev - 0.5) < 2e-3);
}

TEST_CASE_TEMPLATE("rand_uniform stays in [low, high) and fills it evenly", T, float, double, bf16, f16) {
  struct Range {
    double low, high;
  };
  for (const Range r : {Range{0.0, 1.0}, Range{-2.0, 3.0}, Range{1.0, 2.0}}) {
    CAPTURE(r.low);
    CAPTURE(r.high);
    const Tensor<T> u = rand_uniform<T>({1000, 1000}, 4, r.low, r.high);
    const Moments m = moments(u);
    const double width = r.high - r.low;
    CHECK(m.min >= r.low);
    CHECK(m.max < r.high);
    CHECK(m.min < r.low + 1e-3 * width);
    CHECK(m.max > r.high - 1e-2 * width);  // within a bf16 ulp of the top
    CHECK(std::abs(m.mean - (r.low + r.high) / 2) < 2e-3 * width);
    CHECK(std::abs(m.stddev - width / std::sqrt(12.0)) < 2e-3 * width);
  }
}

TEST_CASE("rand_uniform over an empty width gives low") {
  const Tensor<bf16> u = rand_uniform<bf16>({100}, 1, 2.0, 2.0);
  for (std::int64_t i = 0; i < u.numel(); ++i) CHECK(u.flat(i) == bf16(2.0f));
}

TEST_CASE("rand_int stays in [low, high) and hits every value about equally often") {
  const std::int64_t low = -3, high = 4, n = 700000;
  const Tensor<std::int32_t> r = rand_int<std::int32_t>({n}, 8, low, high);
  std::vector<std::int64_t> counts(static_cast<std::size_t>(high - low), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t v = r.flat(i);
    REQUIRE(v >= low);
    REQUIRE(v < high);
    ++counts[static_cast<std::size_t>(v - low)];
  }
  // Expected 100000 each, standard deviation about 300.
  for (std::int64_t c : counts) CHECK(std::abs(c - n / (high - low)) < 2000);

  // The widest allowed range, 2^32 values.
  const Tensor<std::int64_t> wide = rand_int<std::int64_t>({1000}, 8, -(std::int64_t{1} << 31), std::int64_t{1} << 31);
  for (std::int64_t i = 0; i < wide.numel(); ++i) {
    CHECK(wide.flat(i) >= -(std::int64_t{1} << 31));
    CHECK(wide.flat(i) < (std::int64_t{1} << 31));
  }
}

TEST_CASE("random factories reject empty or inverted ranges, naming them") {
  CHECK_THROWS_WITH_AS(rand_int<std::int32_t>({3}, 1, 5, 5), doctest::Contains("rand_int: empty range [5, 5)"),
                       Error);
  CHECK_THROWS_WITH_AS(rand_int<std::int64_t>({3}, 1, 0, (std::int64_t{1} << 32) + 1),
                       doctest::Contains("rand_int: range [0, 4294967297) is wider than 2^32"), Error);
  CHECK_THROWS_WITH_AS(rand_uniform<float>({3}, 1, 2.0, 1.0),
                       doctest::Contains("rand_uniform: low 2 is greater than high 1"), Error);
}

TEST_CASE("random factories refuse non-finite parameters and a negative stddev") {
  CHECK_THROWS_WITH_AS(randn<float>({3}, 1, 0.0, -1.0),
                       "randn: mean and stddev must be finite with stddev >= 0, got mean 0 and stddev -1", Error);
  CHECK_THROWS_WITH_AS(randn<float>({3}, 1, 0.0, NAN), doctest::Contains("got mean 0 and stddev nan"), Error);
  CHECK_THROWS_WITH_AS(randn<double>({3}, 1, INFINITY), doctest::Contains("got mean inf"), Error);
  CHECK_THROWS_WITH_AS(rand_uniform<float>({3}, 1, 0.0, INFINITY),
                       "rand_uniform: low and high must be finite, got 0 and inf", Error);
  CHECK_THROWS_WITH_AS(rand_uniform<float>({3}, 1, NAN, 1.0), doctest::Contains("got nan and 1"), Error);
  CHECK(randn<float>({3}, 1, 0.0, 0.0).flat(2) == 0.0f);  // stddev 0 is a constant
}

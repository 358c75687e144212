#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <type_traits>
#include <vector>

#include "support.hpp"
#include "tapegrad/tapegrad.hpp"
#include "tapegrad/tensor/core/detail/truncated_normal.hpp"

using namespace tapegrad;
using test::bitwise_equal;
using test::moments;
using test::Moments;
using test::ThreadCount;

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double truncated_normal_stddev = 0.87962566103423978;  // of N(0, 1) truncated to [-2, 2]

// Large enough for tight statistics and for the pool to split the work: fan_in 256, fan_out 512, fan_avg 384.
const Shape stats_shape{256, 512};

struct Law {
  double mean, stddev;
};

// Mean and standard deviation of N(0, 1) truncated to [a, b].
Law truncated_standard_normal(double a, double b) {
  const auto pdf = [](double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi); };
  const auto cdf = [](double x) { return 0.5 * std::erfc(-x / std::numbers::sqrt2); };
  const double z = cdf(b) - cdf(a), mean = (pdf(a) - pdf(b)) / z;
  return {mean, std::sqrt(1 + (a * pdf(a) - b * pdf(b)) / z - mean * mean)};
}

// A random initializer with the law and range its values on stats_shape must follow.
struct Expected {
  Initializer init;
  double mean, stddev, low, high;
};

double fan_of(FanMode mode, double fan_in, double fan_out) {
  return mode == FanMode::fan_in ? fan_in : mode == FanMode::fan_out ? fan_out : (fan_in + fan_out) / 2;
}

Expected scaled(const Initializer& init, double scale, FanMode mode, Distribution distribution,
                double fan_in = 256, double fan_out = 512) {
  const double s = std::sqrt(scale / fan_of(mode, fan_in, fan_out));
  switch (distribution) {
    case Distribution::normal: return {init, 0, s, -inf, inf};
    case Distribution::truncated_normal: {
      const double bound = 2 * s / truncated_normal_stddev;
      return {init, 0, s, -bound, bound};
    }
    case Distribution::uniform: break;
  }
  return {init, 0, s, -std::sqrt(3.0) * s, std::sqrt(3.0) * s};
}

std::vector<Expected> random_initializers() {
  const Law t = truncated_standard_normal(-1, 3);
  std::vector<Expected> all = {
      {Initializer::normal(0.02, 0.5), 0.5, 0.02, -inf, inf},
      {Initializer::truncated_normal(1.0), 0, truncated_normal_stddev, -2, 2},
      {Initializer::truncated_normal(0.5, 1.0, -1.0, 3.0), 1 + 0.5 * t.mean, 0.5 * t.stddev, 0.5, 2.5},
      {Initializer::uniform(-1, 3), 1, 4 / std::sqrt(12.0), -1, 3},
      scaled(Initializer::glorot_normal(), 1, FanMode::fan_avg, Distribution::truncated_normal),
      scaled(Initializer::glorot_uniform(), 1, FanMode::fan_avg, Distribution::uniform),
      scaled(Initializer::lecun_normal(), 1, FanMode::fan_in, Distribution::truncated_normal),
      scaled(Initializer::lecun_uniform(), 1, FanMode::fan_in, Distribution::uniform),
      scaled(Initializer::he_normal(), 2, FanMode::fan_in, Distribution::truncated_normal),
      scaled(Initializer::he_uniform(), 2, FanMode::fan_in, Distribution::uniform),
  };
  for (const FanMode mode : {FanMode::fan_in, FanMode::fan_out, FanMode::fan_avg}) {
    for (const Distribution d : {Distribution::normal, Distribution::truncated_normal, Distribution::uniform}) {
      all.push_back(scaled(Initializer::variance_scaling(1.5, mode, d), 1.5, mode, d));
    }
  }
  return all;
}

struct ExpectedConstant {
  Initializer init;
  double value;
};
std::vector<ExpectedConstant> constant_initializers() {
  return {{Initializer::zeros(), 0}, {Initializer::ones(), 1}, {Initializer::constant(0.1), 0.1},
          {Initializer::constant(-3.25), -3.25}};
}

std::vector<Initializer> all_initializers() {
  std::vector<Initializer> all;
  for (const Expected& e : random_initializers()) all.push_back(e.init);
  for (const ExpectedConstant& c : constant_initializers()) all.push_back(c.init);
  return all;
}

// Relative precision of T's significand (f64 values are f32 draws).
template <class T> double epsilon() {
  if constexpr (std::is_same_v<T, bf16>) return 0x1p-8;
  if constexpr (std::is_same_v<T, f16>) return 0x1p-11;
  return 0x1p-23;
}


}  // namespace

TEST_CASE_TEMPLATE("every initializer makes a tensor of the dtype asked for and the shape given", T, float, double,
                   bf16, f16) {
  for (const Initializer& init : all_initializers()) {
    CAPTURE(init.name());
    for (const Shape& shape : {Shape{29, 541}, Shape{3, 3, 5, 7}, Shape{1, 1}}) {
      auto t = init.make<T>(shape, 7);
      static_assert(std::is_same_v<decltype(t), Tensor<T>>);
      CHECK(t.dtype() == dtype_v<T>);
      CHECK(t.shape() == shape);
    }
  }
}

TEST_CASE_TEMPLATE("one seed gives bitwise the same values, another seed other values", T, float, double, bf16, f16) {
  for (const Expected& e : random_initializers()) {
    CAPTURE(e.init.name());
    const Tensor<T> a = e.init.make<T>(stats_shape, 42);
    CHECK(bitwise_equal(a, e.init.make<T>(stats_shape, 42)));
    CHECK_FALSE(bitwise_equal(a, e.init.make<T>(stats_shape, 43)));
  }
}

TEST_CASE_TEMPLATE("bf16, f16 and f64 values are the f32 draw of the same seed rounded to nearest", T, double, bf16,
                   f16) {
  for (const Expected& e : random_initializers()) {
    CAPTURE(e.init.name());
    const Tensor<float> f32 = e.init.make<float>(stats_shape, 5);
    const Tensor<T> t = e.init.make<T>(stats_shape, 5);
    std::int64_t mismatches = 0;
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      mismatches += !(convert<double>(t.flat(i)) == convert<double>(convert<T>(f32.flat(i))));
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE_TEMPLATE("constant initializers hold the value rounded once to T, whatever the seed", T, float, double, bf16,
                   f16) {
  for (const ExpectedConstant& c : constant_initializers()) {
    CAPTURE(c.init.name());
    const Tensor<T> t = c.init.make<T>({29, 541}, 1);
    CHECK(bitwise_equal(t, full<T>({29, 541}, c.value)));
    CHECK(bitwise_equal(t, c.init.make<T>({29, 541}, 2)));
  }
}

TEST_CASE_TEMPLATE("initializer values do not depend on the thread count", T, float, double, bf16, f16) {
  for (const Expected& e : random_initializers()) {
    CAPTURE(e.init.name());
    Tensor<T> one, two;
    {
      ThreadCount threads(1);
      one = e.init.make<T>(stats_shape, 9);
    }
    {
      ThreadCount threads(2);
      two = e.init.make<T>(stats_shape, 9);
    }
    CHECK(bitwise_equal(one, two));
  }
}

TEST_CASE("element i depends on (seed, i) alone, not on the shape") {
  for (const Initializer& init : {Initializer::normal(1.0), Initializer::truncated_normal(0.3, 0.1, -1.5, 0.5),
                                  Initializer::uniform(-2, 5)}) {
    CAPTURE(init.name());
    const Tensor<float> big = init.make<float>({71, 229}, 3);
    const Tensor<float> small = init.make<float>({5}, 3);
    for (std::int64_t i = 0; i < 5; ++i) CHECK(small.flat(i) == big.flat(i));
    CHECK(init.make<float>({}, 3).item() == big.flat(0));
  }
}

TEST_CASE_TEMPLATE("initializer statistics follow each law: mean, stddev and range", T, float, double, bf16, f16) {
  const double n = static_cast<double>(stats_shape.numel());
  for (const Expected& e : random_initializers()) {
    CAPTURE(e.init.name());
    const Moments m = moments(e.init.make<T>(stats_shape, 11));
    CHECK(std::abs(m.mean - e.mean) <= 5 * e.stddev / std::sqrt(n) + epsilon<T>() * std::abs(e.mean));
    CHECK(std::abs(m.stddev - e.stddev) <= 0.02 * e.stddev);
    // Rounding to T may move a value by half an ulp past a bound that T cannot represent.
    CHECK(m.min >= e.low - epsilon<T>() * std::abs(e.low));
    CHECK(m.max <= e.high + epsilon<T>() * std::abs(e.high));
    if (std::isfinite(e.low)) {
      // The draws reach close to both ends of the range.
      CHECK(m.min <= e.low + 0.01 * (e.high - e.low));
      CHECK(m.max >= e.high - 0.01 * (e.high - e.low));
    }
  }
}

TEST_CASE("0.87962566103423978 is the stddev of a standard normal truncated to [-2, 2]") {
  const Law t = truncated_standard_normal(-2, 2);
  CHECK(t.mean == doctest::Approx(0.0));
  CHECK(t.stddev == doctest::Approx(truncated_normal_stddev).epsilon(1e-12));
}

TEST_CASE("erfinv inverts erf to f32 precision over (-1, 1)") {
  double worst = 0;
  for (int k = -2000; k <= 2000; ++k) {
    const double x = 0.99999 * k / 2000.0;
    const float y = philox::erfinv(static_cast<float>(x));
    // The exact inverse of the f32 argument, by Newton's method from the approximation.
    const double xf = static_cast<float>(x);
    double exact = y;
    for (int step = 0; step < 5; ++step) {
      exact -= (std::erf(exact) - xf) / (2 / std::sqrt(std::numbers::pi) * std::exp(-exact * exact));
    }
    if (exact != 0) worst = std::max(worst, std::abs(y - exact) / std::abs(exact));
  }
  CHECK(worst < 1e-6);
}

TEST_CASE("truncated normal stays inside far and narrow bounds") {
  const Moments far = moments(Initializer::truncated_normal(1.0, 0.0, -8.0, 8.0).make<float>({4096}, 1));
  CHECK(far.min >= -8.0);
  CHECK(far.max <= 8.0);
  CHECK(far.stddev == doctest::Approx(1.0).epsilon(0.05));
  const Moments narrow = moments(Initializer::truncated_normal(1.0, 0.0, 3.0, 3.001).make<float>({4096}, 1));
  CHECK(narrow.min >= 3.0);
  CHECK(narrow.max <= 3.001f);
}

TEST_CASE("fans of matrices, stacked matrices and convolution kernels") {
  const auto fans = [](const Shape& shape, const FanAxes& axes = {}) {
    const Fans f = compute_fans(shape, axes);
    return std::vector<std::int64_t>{f.in, f.out};
  };
  using V = std::vector<std::int64_t>;
  CHECK(fans({3, 5}) == V{3, 5});
  // Flax's default: leading dims are a receptive field that multiplies both fans.
  CHECK(fans({4, 3, 5}) == V{12, 20});
  CHECK(fans({3, 3, 16, 32}) == V{144, 288});
  // A layernorm_mlp kernel [H, 2, F]: two [H, F] matrices.
  CHECK(fans({64, 2, 96}, {.in = {0}, .out = {2}, .batch = {1}}) == V{64, 96});
  CHECK(fans({64, 2, 96}, {.in = {0}, .out = {-1}, .batch = {-2}}) == V{64, 96});
  CHECK(fans({64, 2, 96}, {.in = {0}, .out = {2}}) == V{128, 192});
  // Several axes in one role multiply.
  CHECK(fans({4, 6, 8, 10}, {.in = {0, 1}, .out = {2, 3}}) == V{24, 80});
  CHECK(fans({7}, {.in = {}, .out = {0}}) == V{1, 7});
}

TEST_CASE_TEMPLATE("stacked layernorm_mlp kernels scale each [H, F] slice by its own fans", T, float, bf16) {
  const Shape shape{256, 2, 384};
  const Initializer init = Initializer::glorot_uniform();
  const Moments per_slice = moments(init.make<T>(shape, 4, {.in = {0}, .out = {2}, .batch = {1}}));
  CHECK(per_slice.stddev == doctest::Approx(std::sqrt(1.0 / 320)).epsilon(0.02));
  const Moments whole = moments(init.make<T>(shape, 4, {.in = {0}, .out = {2}}));
  CHECK(whole.stddev == doctest::Approx(std::sqrt(1.0 / 640)).epsilon(0.02));
  // A convolution kernel [kh, kw, in, out] with he_normal: variance 2 / (kh·kw·in).
  const Moments conv = moments(Initializer::he_normal().make<T>({3, 3, 64, 128}, 4));
  CHECK(conv.stddev == doctest::Approx(std::sqrt(2.0 / 576)).epsilon(0.02));
}

TEST_CASE("initializers describe themselves") {
  CHECK(Initializer::zeros().name() == "zeros");
  CHECK(Initializer::ones().name() == "ones");
  CHECK(Initializer::constant(0.5).name() == "constant(0.5)");
  CHECK(Initializer::normal(0.02).name() == "normal(stddev=0.02, mean=0)");
  CHECK(Initializer::truncated_normal(0.02).name() == "truncated_normal(stddev=0.02, mean=0, lower=-2, upper=2)");
  CHECK(Initializer::uniform(-1, 1).name() == "uniform(-1, 1)");
  CHECK(Initializer::variance_scaling(1, FanMode::fan_in, Distribution::truncated_normal).name() ==
        "variance_scaling(1, fan_in, truncated_normal)");
  CHECK(Initializer::he_normal().name() == "he_normal = variance_scaling(2, fan_in, truncated_normal)");
  CHECK(Initializer::kaiming_uniform().name() == "he_uniform = variance_scaling(2, fan_in, uniform)");
  CHECK(Initializer::xavier_normal().name() == "glorot_normal = variance_scaling(1, fan_avg, truncated_normal)");
  CHECK(Initializer::lecun_uniform().name() == "lecun_uniform = variance_scaling(1, fan_in, uniform)");
}

TEST_CASE("bad initializer arguments throw naming the initializer and the shape") {
  const Initializer he = Initializer::he_normal();
  CHECK_THROWS_WITH_AS(he.make<float>({}, 1),
                       doctest::Contains("he_normal = variance_scaling(2, fan_in, truncated_normal): in axis -2 is "
                                         "out of range for shape [] (rank 0)"),
                       Error);
  CHECK_THROWS_WITH_AS(he.make<bf16>({5}, 1), doctest::Contains("in axis -2 is out of range for shape [5]"), Error);
  CHECK_THROWS_WITH_AS(Initializer::lecun_uniform().make<f16>({0, 4}, 1),
                       doctest::Contains("lecun_uniform = variance_scaling(1, fan_in, uniform): fan_in is 0 for "
                                         "shape [0, 4]"),
                       Error);
  CHECK_THROWS_WITH_AS(he.make<float>({4, 2, 8}, 1, {.in = {0}, .out = {2}, .batch = {3}}),
                       doctest::Contains("he_normal = variance_scaling(2, fan_in, truncated_normal): batch axis 3 is "
                                         "out of range for shape [4, 2, 8]"),
                       Error);
  CHECK_THROWS_WITH_AS(he.make<float>({4, 2, 8}, 1, {.in = {0}, .out = {-1}, .batch = {2}}),
                       doctest::Contains("axis 2 of shape [4, 2, 8] appears twice in the fan axes (in {0}, out {-1}, "
                                         "batch {2})"),
                       Error);
  CHECK_THROWS_WITH_AS(Initializer::normal(-1.0), doctest::Contains("normal(stddev=-1, mean=0): stddev"), Error);
  CHECK_THROWS_WITH_AS(Initializer::normal(NAN), doctest::Contains("normal(stddev=nan, mean=0): stddev"), Error);
  CHECK_THROWS_WITH_AS(Initializer::truncated_normal(1.0, 0.0, 2.0, -2.0),
                       doctest::Contains("truncated_normal(stddev=1, mean=0, lower=2, upper=-2): bounds"), Error);
  CHECK_THROWS_WITH_AS(Initializer::truncated_normal(1.0, 0.0, 1.0, 1.0), doctest::Contains("lower < upper"), Error);
  CHECK_THROWS_WITH_AS(Initializer::uniform(1, 1), doctest::Contains("uniform(1, 1): bounds"), Error);
  CHECK_THROWS_WITH_AS(Initializer::variance_scaling(-1, FanMode::fan_avg, Distribution::normal),
                       doctest::Contains("variance_scaling(-1, fan_avg, normal): scale"), Error);
  CHECK_THROWS_WITH_AS(Initializer::constant(INFINITY), doctest::Contains("constant: value inf is not finite"), Error);
}

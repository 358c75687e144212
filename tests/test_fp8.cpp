// FP8 dtypes: every conversion to fp8 against a reference that searches the format's values for the nearest one
// (ties to the even code, saturating at the largest finite value), over every class of f32 input (the fp8 values
// and their f32 neighbours, the midpoints between them and theirs, subnormals of both formats, overflow, ±0, ±∞,
// NaNs) and fresh random bit patterns; decoding against the formats' definitions; tensors cast to and from every
// float dtype. Where CUDA's headers are at hand, CUDA's own host conversion (__nv_cvt_float_to_fp8 with
// __NV_SATFINITE) must give the same bits too.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "tapegrad/tapegrad.hpp"

#if __has_include(<cuda_fp8.h>)
#include <cuda_fp8.h>
#define TAPEGRAD_TEST_WITH_CUDA_FP8
#endif

using namespace tapegrad;

namespace {

using fp8::Format;

// The format's definition: mantissa bits, exponent bias, and whether the top exponent is reserved (e5m2) or only its
// all-ones mantissa (e4m3).
struct Definition {
  int mantissa_bits, bias;
  bool ieee_top;
};
template <Format F> constexpr Definition definition() {
  return F == Format::e4m3 ? Definition{3, 7, false} : Definition{2, 15, true};
}

// The value of the positive code c (0..127): NaN or ∞ where the format says so.
template <Format F> double value_of(int c) {
  constexpr Definition d = definition<F>();
  const int exponent = c >> d.mantissa_bits, mantissa = c & ((1 << d.mantissa_bits) - 1);
  const int top = (1 << (7 - d.mantissa_bits)) - 1;
  if (d.ieee_top && exponent == top) return mantissa == 0 ? INFINITY : NAN;
  if (!d.ieee_top && c == 0x7F) return NAN;
  if (exponent == 0) return std::ldexp(mantissa, 1 - d.bias - d.mantissa_bits);
  return std::ldexp((1 << d.mantissa_bits) + mantissa, exponent - d.bias - d.mantissa_bits);
}

// The finite positive values of the format and their codes, ascending.
struct Entry {
  double value;
  std::uint8_t code;
};
template <Format F> std::vector<Entry> finite_values() {
  std::vector<Entry> out;
  for (int c = 0; c < 128; ++c) {
    if (std::isfinite(value_of<F>(c))) out.push_back({value_of<F>(c), static_cast<std::uint8_t>(c)});
  }
  return out;
}

// The reference conversion: the nearest finite value by search, ties to the even code, saturating; NaN gives 0x7F.
template <Format F> std::uint8_t nearest(double x) {
  static const std::vector<Entry> values = finite_values<F>();
  if (std::isnan(x)) return 0x7F;
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double m = std::fabs(x);
  if (m >= values.back().value) return sign | values.back().code;
  const auto above = std::lower_bound(values.begin(), values.end(), m, [](const Entry& e, double v) {
    return e.value < v;
  });
  if (above->value == m) return sign | above->code;
  const Entry& below = *(above - 1);
  const double down = m - below.value, up = above->value - m;
  if (down != up) return sign | (down < up ? below.code : above->code);
  return sign | ((below.code & 1) == 0 ? below.code : above->code);
}

float bits_as_float(std::uint32_t b) { return std::bit_cast<float>(b); }

// Every class of f32 input: for each fp8 value of either format its f32 neighbours and the midpoints (ties) to the
// next value with theirs; f32 zeros, subnormals, extremes, infinities and NaNs; both signs.
std::vector<float> f32_cases() {
  std::vector<float> cases = {0.0f, bits_as_float(0x00000001), bits_as_float(0x007FFFFF),
                              std::numeric_limits<float>::min(), std::numeric_limits<float>::max(), INFINITY,
                              bits_as_float(0x7FC00000), bits_as_float(0x7F800001), bits_as_float(0x7FABCDEF),
                              1e30f, 65536.0f, 61440.0f, 464.0f, 480.0f, 512.0f};
  auto around = [&](float v) {
    cases.push_back(v);
    cases.push_back(std::nextafter(v, INFINITY));
    cases.push_back(std::nextafter(v, -INFINITY));
  };
  auto format_cases = [&](const std::vector<Entry>& values) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      around(static_cast<float>(values[i].value));
      const double next = i + 1 < values.size() ? values[i + 1].value : 2 * values[i].value;
      around(static_cast<float>((values[i].value + next) / 2));  // a tie, exact in f32
    }
    around(static_cast<float>(values[1].value / 2));  // half the smallest subnormal: a tie with 0
  };
  format_cases(finite_values<Format::e4m3>());
  format_cases(finite_values<Format::e5m2>());
  const std::size_t positive = cases.size();
  for (std::size_t i = 0; i < positive; ++i) cases.push_back(-cases[i]);
  return cases;
}

// Fresh random f32 bit patterns; the seed is printed on failure.
std::vector<float> random_f32(std::uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::vector<float> out;
  for (int i = 0; i < n; ++i) out.push_back(bits_as_float(static_cast<std::uint32_t>(rng())));
  return out;
}

template <Format F> void check_conversions(const std::vector<float>& inputs) {
  for (float x : inputs) {
    CAPTURE(std::bit_cast<std::uint32_t>(x));
    CHECK(fp8::from_double<F>(x) == nearest<F>(x));
  }
}

}  // namespace

TEST_CASE("decoding gives each code's value, NaN and infinity as the formats define them") {
  for (int c = 0; c < 256; ++c) {
    CAPTURE(c);
    const double sign = c & 0x80 ? -1 : 1;
    const double e4 = sign * value_of<Format::e4m3>(c & 0x7F), e5 = sign * value_of<Format::e5m2>(c & 0x7F);
    const float got4 = fp8::to_float<Format::e4m3>(static_cast<std::uint8_t>(c));
    const float got5 = fp8::to_float<Format::e5m2>(static_cast<std::uint8_t>(c));
    if (std::isnan(e4)) {
      CHECK(std::isnan(got4));
      CHECK(std::signbit(got4) == (c >= 0x80));
    } else {
      CHECK(static_cast<double>(got4) == e4);
    }
    if (std::isnan(e5)) {
      CHECK(std::isnan(got5));
    } else {
      CHECK(static_cast<double>(got5) == e5);
    }
  }
  CHECK(fp8::to_float<Format::e4m3>(0x7E) == 448.0f);
  CHECK(fp8::to_float<Format::e5m2>(0x7B) == 57344.0f);
  CHECK(fp8::to_float<Format::e5m2>(0x7C) == INFINITY);
  CHECK(fp8::to_float<Format::e4m3>(0x01) == std::ldexp(1.0f, -9));
  CHECK(fp8::to_float<Format::e5m2>(0x01) == std::ldexp(1.0f, -16));
}

TEST_CASE("every f32 class converts to the nearest fp8 value, ties to even, saturating") {
  const std::vector<float> cases = f32_cases();
  check_conversions<Format::e4m3>(cases);
  check_conversions<Format::e5m2>(cases);
  // The rules, spelled out on a few of them.
  CHECK(fp8::from_double<Format::e4m3>(464.0) == 0x7E);      // the tie above 448 rounds to even: 448
  CHECK(fp8::from_double<Format::e4m3>(1e30) == 0x7E);       // saturates
  CHECK(fp8::from_double<Format::e4m3>(-INFINITY) == 0xFE);  // -448
  CHECK(fp8::from_double<Format::e5m2>(INFINITY) == 0x7B);   // 57344, not ∞
  CHECK(fp8::from_double<Format::e5m2>(61440.0) == 0x7B);    // the tie with ∞ saturates too
  CHECK(fp8::from_double<Format::e4m3>(-0.0) == 0x80);
  CHECK(fp8::from_double<Format::e4m3>(std::ldexp(1.0, -10)) == 0x00);  // half the smallest subnormal: to even, 0
  CHECK(fp8::from_double<Format::e4m3>(std::ldexp(3.0, -10)) == 0x02);  // 1.5 subnormal steps: to even, 2
  CHECK(fp8::from_double<Format::e4m3>(NAN) == 0x7F);
  CHECK(fp8::from_double<Format::e5m2>(-NAN) == 0x7F);
}

TEST_CASE("fresh random f32 bit patterns convert to the nearest fp8 value") {
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(seed);
  const std::vector<float> inputs = random_f32(seed, 1 << 20);
  check_conversions<Format::e4m3>(inputs);
  check_conversions<Format::e5m2>(inputs);
}

TEST_CASE("doubles round once, from their exact value") {
  // Just below a tie, by less than f32 can tell: rounded from its own value it goes down; rounded to f32 first it
  // would land on the tie and go to the even code, up.
  const double tie = (value_of<Format::e4m3>(0x41) + value_of<Format::e4m3>(0x42)) / 2;  // between codes 0x41, 0x42
  CHECK(fp8::from_double<Format::e4m3>(tie) == 0x42);
  CHECK(fp8::from_double<Format::e4m3>(tie - std::ldexp(tie, -40)) == 0x41);
  CHECK(fp8::from_double<Format::e4m3>(std::nextafter(tie, 0.0)) == 0x41);
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log_magnitude(-20, 17);
  for (int i = 0; i < 100000; ++i) {
    const double x = (rng() & 1 ? -1 : 1) * std::exp2(log_magnitude(rng));
    CAPTURE(x);
    CHECK(fp8::from_double<Format::e4m3>(x) == nearest<Format::e4m3>(x));
    CHECK(fp8::from_double<Format::e5m2>(x) == nearest<Format::e5m2>(x));
  }
}

TEST_CASE("every finite fp8 value converts back to itself; e5m2 infinities saturate") {
  for (int c = 0; c < 256; ++c) {
    CAPTURE(c);
    const auto code = static_cast<std::uint8_t>(c);
    const float v4 = fp8::to_float<Format::e4m3>(code), v5 = fp8::to_float<Format::e5m2>(code);
    if (!std::isnan(v4)) CHECK(fp8::from_double<Format::e4m3>(v4) == code);
    if (std::isfinite(v5)) CHECK(fp8::from_double<Format::e5m2>(v5) == code);
  }
  CHECK(fp8::from_double<Format::e5m2>(fp8::to_float<Format::e5m2>(0xFC)) == 0xFB);
}

#ifdef TAPEGRAD_TEST_WITH_CUDA_FP8
TEST_CASE("CUDA's own conversion gives the same bits") {
  std::vector<float> inputs = f32_cases();
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(seed);
  const std::vector<float> random = random_f32(seed, 1 << 20);
  inputs.insert(inputs.end(), random.begin(), random.end());
  for (float x : inputs) {
    CAPTURE(std::bit_cast<std::uint32_t>(x));
    CHECK(fp8::from_double<Format::e4m3>(x) == __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
    CHECK(fp8::from_double<Format::e5m2>(x) == __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2));
  }
}
#endif

TEST_CASE("fp8 tensors cast to and from every float dtype, and name their dtypes") {
  CHECK(dtype_name(Tensor<f8e4m3>::dtype()) == "f8e4m3");
  CHECK(dtype_name(Tensor<f8e5m2>::dtype()) == "f8e5m2");
  CHECK(dtype_size(DType::f8e4m3) == 1);
  const Tensor<float> x = randn<float>({4, 33}, std::random_device{}(), 0.0, 100.0);
  const Tensor<f8e4m3> q = cast<f8e4m3>(x);
  const Tensor<f8e5m2> r = cast<f8e5m2>(cast<double>(x));
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    CAPTURE(x.flat(i));
    CHECK(q.flat(i).bits == nearest<Format::e4m3>(x.flat(i)));
    CHECK(r.flat(i).bits == nearest<Format::e5m2>(x.flat(i)));
  }
  // Back to every float dtype, exactly; and from one fp8 format to the other, rounded once.
  const Tensor<float> back = cast<float>(q);
  CHECK(cast<float>(cast<bf16>(q)).to_vector() == back.to_vector());
  CHECK(cast<float>(cast<f16>(q)).to_vector() == back.to_vector());
  CHECK(cast<float>(cast<double>(q)).to_vector() == back.to_vector());
  const Tensor<f8e5m2> requantized = cast<f8e5m2>(q);
  for (std::int64_t i = 0; i < q.numel(); ++i) CHECK(requantized.flat(i).bits == nearest<Format::e5m2>(back.flat(i)));
  // Copies keep the bits.
  CHECK(q.clone().to_vector() == q.to_vector());
}

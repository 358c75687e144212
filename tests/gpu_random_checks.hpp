// Comparing normal draws made on the GPU with the cpu's, within the bounds tensor/factories.hpp and
// tensor/initializers.hpp state (the GPU's log, cos and sin differ from the host's in the last bits of a double).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "support.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::test {

// The spacing of U's values at |x|: 2^(exponent - digits), never below U's smallest subnormal.
template <class U> double ulp(double x) {
  if (x == 0.0) return convert<double>(std::numeric_limits<U>::denorm_min());
  int exponent = 0;
  std::frexp(x, &exponent);  // |x| = m·2^exponent with m in [0.5, 1)
  return std::max(std::ldexp(1.0, exponent - std::numeric_limits<U>::digits),
                  convert<double>(std::numeric_limits<U>::denorm_min()));
}

// Checks GPU normal draws `got` against the cpu's `want` (mean + stddev·z, z within `bound` f32 ulps on the GPU):
// each element within stddev·bound ulps of z (at most twice bound ulps of |want - mean|, as stddev·ulp(z) and
// ulp(stddev·z) differ by less than 2) plus an f32 and a T rounding on each side. In bf16 and f16 differing
// elements straddle a rounding boundary of T, which the f32 values reach rarely: at most 1 in 1000 may differ.
template <class T> void check_normal_draws(const Tensor<T>& got, const Tensor<T>& want, double mean, int bound) {
  REQUIRE(got.shape() == want.shape());
  if (want.numel() == 0) return;
  std::int64_t differing = 0, worst_at = 0;
  double worst = 0.0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double g = convert<double>(got.flat(i)), w = convert<double>(want.flat(i));
    if (g == w) continue;
    ++differing;
    const double allowed = 2 * bound * ulp<float>(w - mean) + ulp<float>(g) + ulp<float>(w) +
                           (is_half_precision_v<T> ? ulp<T>(g) + ulp<T>(w) : 0.0);
    if (std::abs(g - w) / allowed > worst) {
      worst = std::abs(g - w) / allowed;
      worst_at = i;
    }
  }
  const double g = convert<double>(got.flat(worst_at)), w = convert<double>(want.flat(worst_at));
  INFO("worst element ", worst_at, ": gpu ", g, ", cpu ", w, ", ", (g - w) / ulp<float>(w), " f32 ulps apart");
  CHECK(worst <= 1.0);
  if (is_half_precision_v<T>) CHECK(differing * 1000 <= want.numel());
}

}  // namespace tapegrad::test

// A truncated standard normal by inversion: element i maps the Philox uniform u(seed, i) through the inverse CDF
// restricted to [lower, upper], so it depends on (seed, i) alone and costs one draw (no rejection loop). Computed in
// f32 with plain C++ usable from host and device code, like philox.hpp; multiply-adds are explicit fmas, so that
// no compiler's contraction choice changes a bit. Its one logarithm runs in double and is rounded to f32, so host and
// device agree except where the two doubles straddle an f32 rounding boundary.
#pragma once

#include <cmath>
#include <cstdint>

#include "tapegrad/tensor/core/detail/philox.hpp"

namespace tapegrad::philox {

// Inverse error function in f32: M. Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), the
// single-precision polynomials also used by XLA. Valid for |x| < 1.
TAPEGRAD_HOST_DEVICE inline float erfinv(float x) {
  float w = static_cast<float>(-std::log(static_cast<double>((1.0f - x) * (1.0f + x))));
  float p;
  if (w < 5.0f) {
    w -= 2.5f;
    p = 2.81022636e-08f;
    p = std::fma(p, w, 3.43273939e-07f);
    p = std::fma(p, w, -3.5233877e-06f);
    p = std::fma(p, w, -4.39150654e-06f);
    p = std::fma(p, w, 0.00021858087f);
    p = std::fma(p, w, -0.00125372503f);
    p = std::fma(p, w, -0.00417768164f);
    p = std::fma(p, w, 0.246640727f);
    p = std::fma(p, w, 1.50140941f);
  } else {
    w = std::sqrt(w) - 3.0f;
    p = -0.000200214257f;
    p = std::fma(p, w, 0.000100950558f);
    p = std::fma(p, w, 0.00134934322f);
    p = std::fma(p, w, -0.00367342844f);
    p = std::fma(p, w, 0.00573950773f);
    p = std::fma(p, w, -0.0076224613f);
    p = std::fma(p, w, 0.00943887047f);
    p = std::fma(p, w, 1.00167406f);
    p = std::fma(p, w, 2.83297682f);
  }
  return p * x;
}

// The standard normal restricted to [lower, upper], with erf(lower/√2) and erf(upper/√2) computed once by the
// caller (on the host, so that every device inverts the same interval).
struct TruncatedBounds {
  float lower, upper, erf_lower, erf_upper;
};

inline TruncatedBounds truncated_bounds(float lower, float upper) {
  constexpr float inv_sqrt2 = 0.70710678118654752440f;
  return {lower, upper, std::erf(lower * inv_sqrt2), std::erf(upper * inv_sqrt2)};
}

TAPEGRAD_HOST_DEVICE inline float truncated_normal(std::uint64_t seed, std::uint64_t i, const TruncatedBounds& b) {
  constexpr float sqrt2 = 1.41421356237309504880f, below_one = 1.0f - 0x1p-24f;
  float e = std::fma(b.erf_upper - b.erf_lower, uniform(seed, i), b.erf_lower);
  // erf of a far bound rounds to ±1 in f32, where erfinv is infinite: keep e inside (-1, 1).
  e = std::fmin(std::fmax(e, -below_one), below_one);
  // Rounding in the inversion may step just past a bound; clamp so the range always holds.
  return std::fmin(std::fmax(sqrt2 * erfinv(e), b.lower), b.upper);
}

}  // namespace tapegrad::philox

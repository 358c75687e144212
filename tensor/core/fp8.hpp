// The two 8-bit float formats of FP8 training, as stored bits, and the conversions to and from them: written once for
// the host and the GPU kernels (TAPEGRAD_HOST_DEVICE), so that a cast gives the same bits on every device.
//
//   e4m3: sign, 4 exponent bits (bias 7), 3 mantissa bits; largest finite 448, smallest subnormal 2^-9; no infinity;
//         S.1111.111 is NaN.
//   e5m2: sign, 5 exponent bits (bias 15), 2 mantissa bits; largest finite 57344, smallest subnormal 2^-16; IEEE
//         infinities (S.11111.00) and NaNs.
//
// To fp8: round to nearest even and saturate, as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...): a value that
// rounds past the largest finite one, and ±∞, give ±448 (±57344); ±0 keep their sign; every NaN gives the NaN 0x7F.
// The input is a double: every f32, bf16 and f16 value converts to it exactly, so each rounds once, correctly.
// From fp8: exact (every fp8 value is a float, a bf16 and an f16); a NaN gives a quiet NaN of its sign.
#pragma once

#include <cmath>
#include <cstdint>

#include "tapegrad/tensor/core/detail/host_device.hpp"

namespace tapegrad::fp8 {

enum class Format : std::uint8_t { e4m3, e5m2 };

template <Format F> struct Spec;
template <> struct Spec<Format::e4m3> {
  static constexpr int mantissa_bits = 3, bias = 7, max_exponent = 8;
  static constexpr std::uint8_t max_code = 0x7E;  // 448 = 1.75 · 2^8
};
template <> struct Spec<Format::e5m2> {
  static constexpr int mantissa_bits = 2, bias = 15, max_exponent = 15;
  static constexpr std::uint8_t max_code = 0x7B;  // 57344 = 1.75 · 2^15
};

inline constexpr std::uint8_t nan_code = 0x7F;  // what every NaN converts to, in both formats

// The largest finite value of the format: 448 or 57344.
template <Format F> TAPEGRAD_HOST_DEVICE constexpr float max_value() {
  return F == Format::e4m3 ? 448.0f : 57344.0f;
}
TAPEGRAD_HOST_DEVICE constexpr float max_value(Format f) {
  return f == Format::e4m3 ? max_value<Format::e4m3>() : max_value<Format::e5m2>();
}

// Scales: a tensor x is stored as fp8(x · scale) and read back as fp8 · (1 / scale). Each maps the amax (max |x|)
// the scaling looks at onto the format's largest value, in f32, as TransformerEngine computes them.

// Delayed scaling: max / amax / factor, the factor being 2^margin (margin_factor below); an amax of 0 keeps the
// previous scale, and a scale past f32's range is f32's largest (the caller refuses a non-finite amax).
TAPEGRAD_HOST_DEVICE inline float delayed_scale_by(float amax, float previous, float max, float factor) {
  constexpr float f32_max = 3.40282346638528859812e+38f;
  if (!(amax > 0.0f)) return previous;
  const float scale = max / amax / factor;
  return scale <= f32_max ? scale : f32_max;
}

// 2^margin, on the host only: the device's exp2 may differ by an ulp where the margin is not an integer, so a
// kernel is given the host's factor and both divide by the same float.
inline float margin_factor(float margin) { return std::exp2(margin); }

// The same from the margin itself, on the host.
inline float delayed_scale(float amax, float previous, float max, float margin) {
  return delayed_scale_by(amax, previous, max, margin_factor(margin));
}

// Current scaling: max / amax of the tensor itself; 1 for a tensor of zeros.
TAPEGRAD_HOST_DEVICE inline float current_scale(float amax, float max) {
  return delayed_scale_by(amax, 1.0f, max, 1.0f);
}

// Block scaling's tiles: 1 × block_tile of activations and gradients along a product's inner dimension, block_tile ×
// block_tile of weights (DeepSeek-V3's, and the only sizes Hopper's block-scaled GEMMs take).
inline constexpr int block_tile = 128;

// Block scaling: the largest power of two not above max / amax (dequantization is then exact); 1 for zeros.
TAPEGRAD_HOST_DEVICE inline float block_scale(float amax, float max) {
  const float scale = current_scale(amax, max);
  int exponent = 0;
  std::frexp(scale, &exponent);  // scale = f · 2^exponent, f in [0.5, 1)
  return std::ldexp(1.0f, exponent - 1);
}

// The fp8 bits of `x`, rounded to nearest even, saturated.
template <Format F> TAPEGRAD_HOST_DEVICE inline std::uint8_t from_double(double x) {
  using S = Spec<F>;
  constexpr int m = S::mantissa_bits;
  constexpr int min_exponent = 1 - S::bias;  // of the normal numbers
  if (x != x) return nan_code;
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double magnitude = std::fabs(x);
  if (magnitude == 0) return sign;
  if (!(magnitude < std::ldexp(1.0, S::max_exponent + 1))) return sign | S::max_code;  // ±∞, and all that saturates
  // Count the value in units of its fp8 spacing (an exact scaling by a power of two), round that to an integer.
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude = f · 2^exponent, f in [0.5, 1)
  const int scale = (exponent - 1 < min_exponent ? min_exponent : exponent - 1) - m;
  const double units = std::rint(std::ldexp(magnitude, -scale));  // the default rounding: to nearest even
  // Below the normal range the count is the code itself (2^m being the smallest normal); above, the count lies in
  // [2^m, 2^(m+1)] and the exponent field is added (a count of 2^(m+1) carries into the next exponent).
  const int code = scale == min_exponent - m ? static_cast<int>(units)
                                             : ((scale + m + S::bias) << m) + static_cast<int>(units) - (1 << m);
  return sign | static_cast<std::uint8_t>(code > S::max_code ? S::max_code : code);
}

// The value of fp8 bits `bits`, exactly.
template <Format F> TAPEGRAD_HOST_DEVICE inline float to_float(std::uint8_t bits) {
  using S = Spec<F>;
  constexpr int m = S::mantissa_bits;
  const int exponent_field = (bits & 0x7F) >> m, mantissa = bits & ((1 << m) - 1);
  const float sign = bits & 0x80 ? -1.0f : 1.0f;
  if constexpr (F == Format::e4m3) {
    if ((bits & 0x7F) == 0x7F) return std::copysign(NAN, sign);
  } else {
    if (exponent_field == 31) return mantissa == 0 ? sign * INFINITY : std::copysign(NAN, sign);
  }
  if (exponent_field == 0) return sign * std::ldexp(static_cast<float>(mantissa), 1 - S::bias - m);
  return sign * std::ldexp(static_cast<float>((1 << m) + mantissa), exponent_field - S::bias - m);
}

}  // namespace tapegrad::fp8

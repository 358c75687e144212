// Element types tapegrad tensors can hold, with a runtime tag for each.
//
// bf16 and f16 are Eigen's host types: their conversions from float round to nearest even. Arithmetic on them
// goes through `compute_t`, which is float for the 16-bit types (the ops compute in f32 and round once). f8e4m3 and
// f8e5m2 hold FP8 bits (tensor/core/fp8.hpp): tensors of them are stored, copied and cast, not computed on.
#pragma once

#include <Eigen/Core>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "tapegrad/tensor/core/dtype_tag.hpp"
#include "tapegrad/tensor/core/fp8.hpp"

namespace tapegrad {

using bf16 = Eigen::bfloat16;
using f16 = Eigen::half;

// An FP8 value as its stored bits; it converts to and from the other types through convert<>.
template <fp8::Format F> struct Fp8 {
  static constexpr fp8::Format format = F;
  std::uint8_t bits = 0;
  friend bool operator==(Fp8, Fp8) = default;  // bitwise
};
using f8e4m3 = Fp8<fp8::Format::e4m3>;
using f8e5m2 = Fp8<fp8::Format::e5m2>;

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<f8e4m3> { static constexpr DType value = DType::f8e4m3; };
template <> struct dtype_of<f8e5m2> { static constexpr DType value = DType::f8e5m2; };
template <class T> inline constexpr DType dtype_v = dtype_of<T>::value;

// The floating types that ops and the tape are instantiated for.
template <class T>
inline constexpr bool is_float_dtype_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

template <class T>
inline constexpr bool is_half_precision_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

template <class T> inline constexpr bool is_fp8_v = std::is_same_v<T, f8e4m3> || std::is_same_v<T, f8e5m2>;

// The type arithmetic on T is carried out in: f32 for the 16-bit floats, T itself otherwise.
template <class T> using compute_t = std::conditional_t<is_half_precision_v<T>, float, T>;

namespace detail {
// `v` rounded to f32 with round-to-odd (truncate, then set the last bit when inexact). Rounding that to nearest
// in a format of at most 22 significant bits (bf16 has 8, f16 11) gives the correctly rounded result, where
// rounding to nearest twice would not: a value just above a bf16 tie would land on the tie, then round to even.
inline float round_to_odd_float(double v) {
  float f = static_cast<float>(v);
  if (std::isnan(v) || static_cast<double>(f) == v) return f;
  if (std::abs(static_cast<double>(f)) > std::abs(v)) f = std::nextafter(f, 0.0f);
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) | 1u);
}
}  // namespace detail

// Round-to-nearest-even conversion between any two element types (to fp8 saturating, as tensor/core/fp8.hpp says).
template <class To, class From> inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (is_fp8_v<From>) {
    return convert<To>(fp8::to_float<From::format>(v.bits));
  } else if constexpr (is_fp8_v<To>) {
    return To{fp8::from_double<To::format>(convert<double>(v))};
  } else if constexpr (is_half_precision_v<To> && std::is_same_v<From, double>) {
    return static_cast<To>(detail::round_to_odd_float(v));
  } else if constexpr (is_half_precision_v<From>) {
    return static_cast<To>(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

// Instantiates MACRO(T) for each floating dtype; keeps explicit instantiation lists in one place.
#define TAPEGRAD_FOR_EACH_FLOAT(MACRO) \
  MACRO(float)                         \
  MACRO(double)                        \
  MACRO(::tapegrad::bf16)              \
  MACRO(::tapegrad::f16)

}  // namespace tapegrad

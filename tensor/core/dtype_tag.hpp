// The runtime tag of an element type, its name and size. Plain C++ with no Eigen: the CUDA launchers take it
// (cuda/*.hpp), so that nvcc never compiles Eigen's headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tapegrad {

enum class DType : std::uint8_t { f32, f64, bf16, f16, i32, i64, f8e4m3, f8e5m2 };

constexpr std::string_view dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::f8e4m3: return "f8e4m3";
    case DType::f8e5m2: return "f8e5m2";
  }
  return "?";
}

constexpr bool is_fp8(DType d) { return d == DType::f8e4m3 || d == DType::f8e5m2; }

constexpr std::size_t dtype_size(DType d) {
  switch (d) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::bf16:
    case DType::f16: return 2;
    case DType::f8e4m3:
    case DType::f8e5m2: return 1;
  }
  return 0;
}

// The type a floating dtype's arithmetic accumulates in: f64 for f64, f32 for f32, bf16, f16 and the fp8 types.
constexpr DType compute_dtype(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }

}  // namespace tapegrad

// The dtype conversion kernel. A value widens exactly to f64 (from f64) or f32 (from the others) and rounds once
// to the target with launch.cuh's conversions, which round to nearest even (f64 to bf16/f16 directly, hence
// correctly rounded, as the CPU's round-to-odd path is). NaNs are built bit by bit rather than left to the
// hardware's conversions, whose NaN results need not be the CPU's (which are a mix of x86's and Eigen's rules). FP8
// values go through tensor/core/fp8.hpp's functions, the CPU's own: to fp8 from the exact f64 value, from fp8 by way
// of the exact f32 value.
#include "tapegrad/tensor/gpu/detail/cast.hpp"

#include <cstring>
#include <type_traits>

#include "tapegrad/tensor/core/fp8.hpp"
#include "tapegrad/tensor/gpu/detail/launch.cuh"

namespace tapegrad::cuda {

namespace {

// The bits of each storage type: the unsigned integer of its size, the width of its mantissa field, and the masks
// of its sign and exponent fields.
template <class B, int Mantissa, B Sign, B Exponent> struct Fields {
  using Bits = B;
  static constexpr int mantissa = Mantissa;
  static constexpr Bits sign = Sign, exponent = Exponent;
};
template <class S> struct Layout;
template <> struct Layout<float> : Fields<std::uint32_t, 23, 0x80000000u, 0x7F800000u> {};
template <> struct Layout<double> : Fields<std::uint64_t, 52, 0x8000000000000000u, 0x7FF0000000000000u> {};
template <> struct Layout<__nv_bfloat16> : Fields<std::uint16_t, 7, 0x8000u, 0x7F80u> {};
template <> struct Layout<__half> : Fields<std::uint16_t, 10, 0x8000u, 0x7C00u> {};

template <class To, class From> __device__ To bits_as(From v) {
  static_assert(sizeof(To) == sizeof(From));
  To out;
  memcpy(&out, &v, sizeof(To));
  return out;
}

template <class S> __device__ bool is_nan(S v) {
  using L = Layout<S>;
  using Bits = typename L::Bits;
  return static_cast<Bits>(bits_as<Bits>(v) & static_cast<Bits>(~L::sign)) > L::exponent;
}

// The NaN the CPU makes of NaN `v`, sign kept: Eigen's conversions give bf16 and f16 results the quiet NaN, and
// move a bf16/f16 payload up into an f32 unchanged; x86's conversions (between f32 and f64, and so on to f64 from
// the 16-bit types) keep the payload's leading bits and make it quiet.
template <class To, class From> __device__ To nan_like(From v) {
  using In = typename Layout<From>::Bits;
  using Out = typename Layout<To>::Bits;
  constexpr int in_mantissa = Layout<From>::mantissa, out_mantissa = Layout<To>::mantissa;
  const In bits = bits_as<In>(v);
  const auto quiet = static_cast<Out>(Out{1} << (out_mantissa - 1));
  auto out = Layout<To>::exponent;
  if (bits & Layout<From>::sign) out = static_cast<Out>(out | Layout<To>::sign);
  if constexpr (sizeof(To) == 2) {
    return bits_as<To>(static_cast<Out>(out | quiet));
  } else {
    const auto field = static_cast<In>(bits & static_cast<In>((In{1} << in_mantissa) - 1));
    if constexpr (in_mantissa >= out_mantissa) {
      out = static_cast<Out>(out | static_cast<Out>(field >> (in_mantissa - out_mantissa)));
    } else {
      out = static_cast<Out>(out | static_cast<Out>(static_cast<Out>(field) << (out_mantissa - in_mantissa)));
    }
    if constexpr (!(sizeof(From) == 2 && std::is_same_v<To, float>)) out = static_cast<Out>(out | quiet);
    return bits_as<To>(out);
  }
}

// FP8 bits on the device.
template <fp8::Format F> struct Fp8Bits {
  static constexpr fp8::Format format = F;
  std::uint8_t bits;
};
template <class S> inline constexpr bool is_fp8 = false;
template <fp8::Format F> inline constexpr bool is_fp8<Fp8Bits<F>> = true;

template <class To, class From> __device__ To convert(From v) {
  if constexpr (is_fp8<From>) {
    return convert<To>(fp8::to_float<From::format>(v.bits));
  } else if constexpr (is_fp8<To>) {
    return To{fp8::from_double<To::format>(to_compute<double>(v))};
  } else {
    if (is_nan(v)) return nan_like<To>(v);
    using Wide = std::conditional_t<std::is_same_v<From, double>, double, float>;
    return from_compute<To>(to_compute<Wide>(v));
  }
}

// Calls fn(S{}) with S the device storage type of a floating or fp8 dtype.
template <class Fn> void dispatch_castable(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f8e4m3: return fn(Fp8Bits<fp8::Format::e4m3>{});
    case DType::f8e5m2: return fn(Fp8Bits<fp8::Format::e5m2>{});
    default: return dispatch_float(dtype, "cast", fn);
  }
}

template <class To, class From> __global__ void cast_kernel(const From* src, To* dst, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    dst[i] = convert<To>(src[i]);
  }
}

}  // namespace

void cast(DType from, const void* src, DType to, void* dst, std::int64_t n, int device) {
  if (n == 0) return;
  Launch launch(device);
  if (from == to) {
    TAPEGRAD_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * dtype_size(from),
                                        cudaMemcpyDeviceToDevice, launch.stream()));
    return;
  }
  dispatch_castable(from, [&](auto from_tag) {
    dispatch_castable(to, [&](auto to_tag) {
      using From = decltype(from_tag);
      using To = decltype(to_tag);
      constexpr int threads = 256;
      cast_kernel<To, From><<<launch.blocks_for(n, threads), threads, 0, launch.stream()>>>(
          static_cast<const From*>(src), static_cast<To*>(dst), n);
      TAPEGRAD_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace tapegrad::cuda

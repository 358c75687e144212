// FP8 casts on the GPU give the CPU's bits: every f32 bit pattern, every bf16 and f16 pattern and fresh random f64
// values to both fp8 formats; every fp8 code to every float dtype and to the other format.
#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <random>
#include <vector>

#include "gpu_reference.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::gpu;

namespace {

const Device host = Device::cpu();

template <class T> auto bits_of(T v) {
  if constexpr (is_fp8_v<T>) {
    return v.bits;
  } else if constexpr (sizeof(T) == 2) {
    return std::bit_cast<std::uint16_t>(v);
  } else if constexpr (sizeof(T) == 4) {
    return std::bit_cast<std::uint32_t>(v);
  } else {
    return std::bit_cast<std::uint64_t>(v);
  }
}

// Casts x to To on the GPU and on the CPU; returns how many elements differ in their bits (and the first one).
template <class To, class From> void check_cast(const Tensor<From>& x) {
  INFO("cast from ", dtype_name(dtype_v<From>), " to ", dtype_name(dtype_v<To>));
  const Tensor<To> got = cast<To>(x.to(gpu)).to(host);
  const Tensor<To> want = cast<To>(x);
  std::int64_t mismatches = 0, first = -1;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    if (bits_of(got.flat(i)) == bits_of(want.flat(i))) continue;
    if (mismatches++ == 0) first = i;
  }
  INFO("first mismatch at ", first, " of ", x.numel());
  CHECK(mismatches == 0);
}

template <class To> void check_every_f32() {
  constexpr std::int64_t chunk = std::int64_t{1} << 28;
  for (std::int64_t start = 0; start < (std::int64_t{1} << 32); start += chunk) {
    Tensor<float> x({chunk});
    parallel_for(chunk, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) x.flat(i) = std::bit_cast<float>(static_cast<std::uint32_t>(start + i));
    });
    check_cast<To>(x);
  }
}

template <class T, class To> void check_every_16_bit_pattern() {
  Tensor<T> x({1 << 16});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.flat(i) = std::bit_cast<T>(static_cast<std::uint16_t>(i));
  check_cast<To>(x);
}

template <class Fp8> Tensor<Fp8> every_code() {
  Tensor<Fp8> x({256});
  for (int c = 0; c < 256; ++c) x.flat(c) = Fp8{static_cast<std::uint8_t>(c)};
  return x;
}

}  // namespace

TEST_CASE("every f32 bit pattern converts to fp8 on the GPU as on the CPU") {
  check_every_f32<f8e4m3>();
  check_every_f32<f8e5m2>();
}

TEST_CASE("every bf16 and f16 pattern and random doubles convert to fp8 on the GPU as on the CPU") {
  check_every_16_bit_pattern<bf16, f8e4m3>();
  check_every_16_bit_pattern<bf16, f8e5m2>();
  check_every_16_bit_pattern<f16, f8e4m3>();
  check_every_16_bit_pattern<f16, f8e5m2>();
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  Tensor<double> x({1 << 20});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.flat(i) = std::bit_cast<double>(rng());
  check_cast<f8e4m3>(x);
  check_cast<f8e5m2>(x);
}

TEST_CASE("every fp8 code converts to every float dtype and to the other format on the GPU as on the CPU") {
  const Tensor<f8e4m3> e4 = every_code<f8e4m3>();
  const Tensor<f8e5m2> e5 = every_code<f8e5m2>();
  check_cast<float>(e4);
  check_cast<double>(e4);
  check_cast<bf16>(e4);
  check_cast<f16>(e4);
  check_cast<f8e5m2>(e4);
  check_cast<float>(e5);
  check_cast<double>(e5);
  check_cast<bf16>(e5);
  check_cast<f16>(e5);
  check_cast<f8e4m3>(e5);
}

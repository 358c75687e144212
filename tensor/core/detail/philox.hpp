// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a counter-based generator.
// Element i of a random tensor depends only on (seed, i), so values do not depend on the thread count, the dtype
// or (with the CUDA backend) the device. Plain C++ usable from host and device code; no Eigen here.
#pragma once

#include <cmath>
#include <cstdint>

#include "tapegrad/tensor/core/detail/host_device.hpp"

namespace tapegrad::philox {

struct Block {
  std::uint32_t w[4];
};

TAPEGRAD_HOST_DEVICE inline void mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}

struct Key {
  std::uint32_t w[2];
};

// The Philox4x32-10 block function: ten rounds of `counter` under `key`, bumping the key between rounds. Exposed
// so that tests can pin it against the published Random123 known-answer vectors.
TAPEGRAD_HOST_DEVICE inline Block philox4x32_10(Block counter, Key key) {
  std::uint32_t c0 = counter.w[0], c1 = counter.w[1], c2 = counter.w[2], c3 = counter.w[3];
  std::uint32_t k0 = key.w[0], k1 = key.w[1];
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c0, hi0, lo0);
    mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    const std::uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// The 128 random bits at counter (index, stream) under key `seed`.
TAPEGRAD_HOST_DEVICE inline Block block(std::uint64_t seed, std::uint64_t index, std::uint32_t stream) {
  const Block counter{{static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), stream, 0}};
  const Key key{{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
  return philox4x32_10(counter, key);
}

// Streams keep the uniform, normal and integer sequences of one seed independent of each other.
enum Stream : std::uint32_t { uniform_stream = 0, normal_stream = 1, integer_stream = 2 };

// 32 random bits for element i.
TAPEGRAD_HOST_DEVICE inline std::uint32_t bits(std::uint64_t seed, std::uint64_t i, std::uint32_t stream) {
  return block(seed, i / 4, stream).w[i % 4];
}

// Uniform in [0, 1) with 24 random bits: exactly representable in f32, so identical on every device.
TAPEGRAD_HOST_DEVICE inline float to_unit_float(std::uint32_t x) { return static_cast<float>(x >> 8) * 0x1p-24f; }

TAPEGRAD_HOST_DEVICE inline float uniform(std::uint64_t seed, std::uint64_t i) {
  return to_unit_float(bits(seed, i, uniform_stream));
}

// Standard normal by Box-Muller: elements 2k and 2k+1 are the cosine and sine halves of one pair. The uniform
// inputs are exact f32 values; log, sqrt, cos and sin run in double and z is rounded to f32 once. Host and device
// libraries differ in the last bits of a double (an ulp or two, 2^-52 relative), so their z agree in f32 except
// where the two doubles straddle an f32 rounding boundary, and then by one ulp (tensor/factories.hpp).
TAPEGRAD_HOST_DEVICE inline float normal(std::uint64_t seed, std::uint64_t i) {
  const Block b = block(seed, i / 2, normal_stream);
  const double u1 = static_cast<double>((b.w[0] >> 8) + 1u) * 0x1p-24;  // (0, 1]: log stays finite
  const double u2 = static_cast<double>(b.w[1] >> 8) * 0x1p-24;
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 6.28318530717958647692 * u2;
  return static_cast<float>((i % 2 == 0) ? r * std::cos(theta) : r * std::sin(theta));
}

// Integer in [low, high): multiply-shift of 32 random bits (bias below 2^-32 * range; deterministic everywhere).
TAPEGRAD_HOST_DEVICE inline std::int64_t integer(std::uint64_t seed, std::uint64_t i, std::int64_t low,
                                                 std::int64_t high) {
  const std::uint64_t range = static_cast<std::uint64_t>(high - low);
  const std::uint64_t x = bits(seed, i, integer_stream);
  return low + static_cast<std::int64_t>((x * range) >> 32);
}

}  // namespace tapegrad::philox

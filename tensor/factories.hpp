// Ways to make a tensor. Random factories are deterministic in the seed: element i is drawn in f32 from
// (seed, i) by the Philox generator and then rounded to T, so f32, f64, bf16 and f16 tensors of one seed hold
// the same values up to that rounding, whatever the thread count. (One exception keeps rand_uniform half-open: a
// value that rounding to T carried up to `high` becomes the largest T below `high`.)
//
// Across devices (the CPU and the GPU compute each element by the same formula, tensor/core/detail/random_draws.hpp):
// - rand_uniform and rand_int give bitwise the same tensor on every device, in every dtype.
// - randn draws z by Box-Muller with log, sqrt, cos and sin in double, rounded to f32 once
//   (tensor/core/detail/philox.hpp). The host's and CUDA's double functions differ by an ulp or two of a double, so a
//   GPU's z equals the cpu's except where the two doubles straddle an f32 rounding boundary (a few elements per
//   billion), and is then one f32 ulp away: within randn_ulp_bound. mean + stddev·z is one fma and one rounding to T on each side.
#pragma once

#include <cstdint>
#include <vector>

#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad {

// Constants on any device (`value` rounded to T once, to nearest even).
template <class T> Tensor<T> zeros(const Shape& shape, Device device = Device::cpu());
template <class T> Tensor<T> ones(const Shape& shape, Device device = Device::cpu());
template <class T> Tensor<T> full(const Shape& shape, double value, Device device = Device::cpu());
// 0, 1, ..., n-1 (as T).
template <class T> Tensor<T> arange(std::int64_t n);
template <class T> Tensor<T> from_vector(const std::vector<T>& values, const Shape& shape);
// Normal(mean, stddev), computed in f32 as fma(stddev, z, mean), then rounded.
template <class T>
Tensor<T> randn(const Shape& shape, std::uint64_t seed, double mean = 0.0, double stddev = 1.0,
                Device device = Device::cpu());
// Uniform in [low, high), computed in f32 as fma(high - low, u, low), then rounded (never to `high`).
template <class T>
Tensor<T> rand_uniform(const Shape& shape, std::uint64_t seed, double low = 0.0, double high = 1.0,
                       Device device = Device::cpu());
// Integers in [low, high) (T is std::int32_t or std::int64_t).
template <class T>
Tensor<T> rand_int(const Shape& shape, std::uint64_t seed, std::int64_t low, std::int64_t high,
                   Device device = Device::cpu());

// How far a GPU's standard normal draw z may be from the cpu's, in f32 ulps of z (see the top of this file).
inline constexpr int randn_ulp_bound = 1;

}  // namespace tapegrad

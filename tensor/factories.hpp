// Ways to make a tensor. Random factories are deterministic in the seed: element i is drawn in f32 from
// (seed, i) by the Philox generator and then rounded to T, so f32, f64, bf16 and f16 tensors of one seed hold
// the same values up to that rounding, whatever the thread count. (One exception keeps rand_uniform half-open: a
// value that rounding to T carried up to `high` becomes the largest T below `high`.)
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.hpp"

namespace tapegrad {

// Constants on any device (`value` rounded to T once, to nearest even).
template <class T> Tensor<T> zeros(const Shape& shape, Device device = Device::cpu());
template <class T> Tensor<T> ones(const Shape& shape, Device device = Device::cpu());
template <class T> Tensor<T> full(const Shape& shape, double value, Device device = Device::cpu());
// 0, 1, ..., n-1 (as T).
template <class T> Tensor<T> arange(std::int64_t n);
template <class T> Tensor<T> from_vector(const std::vector<T>& values, const Shape& shape);
// Normal(mean, stddev), computed in f32 then rounded.
template <class T> Tensor<T> randn(const Shape& shape, std::uint64_t seed, double mean = 0.0, double stddev = 1.0);
// Uniform in [low, high), computed in f32 then rounded (never to `high`).
template <class T>
Tensor<T> rand_uniform(const Shape& shape, std::uint64_t seed, double low = 0.0, double high = 1.0);
// Integers in [low, high) (T is std::int32_t or std::int64_t).
template <class T> Tensor<T> rand_int(const Shape& shape, std::uint64_t seed, std::int64_t low, std::int64_t high);

}  // namespace tapegrad

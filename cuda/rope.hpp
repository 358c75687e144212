// Rotary position embeddings (nn::rope, ops/rope.cpp): the rotation rule, which the CPU loop and the CUDA kernel both
// compile, and the GPU launcher. Plain C++ (see tensor/gpu/backend.hpp for how ops call it).
//
// x is rows of D contiguous features: row (b, h, s) starts at b·batch_stride + h·head_stride + s·row_stride, and the
// output has the same layout. Heads come in periods of head_period; in a row of one of the first `rotated_heads` of
// its period, pair i < rotary_dim / 2 (features
// (i, i + rotary_dim/2), or (2i, 2i+1) when interleaved) turns by the angle (s + position_offset)·base^(-2i/rotary_dim)
// (by minus that when `inverse`: the backward); every other feature is copied.
#pragma once

#include <cmath>
#include <cstdint>

#include "tapegrad/tensor/core/detail/host_device.hpp"
#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

struct RopeProblem {
  std::int64_t batch = 0, heads = 0, S = 0, D = 0;
  std::int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
  std::int64_t head_period = 1, rotated_heads = 0, rotary_dim = 0, position_offset = 0;
  double base = 10000;
  bool interleaved = false, inverse = false;

  TAPEGRAD_HOST_DEVICE std::int64_t row_at(std::int64_t b, std::int64_t h, std::int64_t s) const {
    return b * batch_stride + h * head_stride + s * row_stride;
  }
  // Slot j of the ceil(D / 2) of a row of head h: the pair it turns (true; its two features in first, second) or the
  // features it copies (false; first, and second when below D).
  TAPEGRAD_HOST_DEVICE bool slot(std::int64_t h, std::int64_t j, std::int64_t& first, std::int64_t& second) const {
    const std::int64_t rotary = h % head_period < rotated_heads ? rotary_dim : 0, half = rotary / 2;
    if (j < half) {
      first = interleaved ? 2 * j : j;
      second = interleaved ? 2 * j + 1 : j + half;
      return true;
    }
    first = rotary + 2 * (j - half);
    second = first + 1;
    return false;
  }
  // The rotation of pair i at sequence position s, in double.
  TAPEGRAD_HOST_DEVICE void rotation(std::int64_t s, std::int64_t i, double& cosine, double& sine) const {
    const double angle = static_cast<double>(s + position_offset) *
                         std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim));
    cosine = std::cos(angle);
    sine = inverse ? -std::sin(angle) : std::sin(angle);
  }
};

// (a, b) turned by the angle whose cosine and sine are c and s: explicit fmas and one separate product each, so that
// no compiler's contraction changes a bit between the devices.
template <class C> TAPEGRAD_HOST_DEVICE void rotate_pair(C a, C b, C c, C s, C& out_a, C& out_b) {
  out_a = std::fma(a, c, -(b * s));
  out_b = std::fma(b, c, a * s);
}

// out = x turned, elements of `dtype` (a floating one), on `device`'s current stream.
void rope(DType dtype, const RopeProblem& problem, const void* x, void* out, int device);

}  // namespace tapegrad::cuda

// The CPU's quantization of a GEMM input (ops/fp8/recipe.hpp's recipes), the reference the GPU's fused kernels are held
// to. Internal to ops/.
//
// A [rows, cols] row-major matrix is quantized to fp8 with either one scale (delayed and current scaling) or a scale
// per tile (block scaling: tiles of tile_rows × tile_cols, the last ones cut short), and handed to the product as the
// values the GEMM multiplies: fp8 · (1 / scale), in the compute type. The amax is taken over the same elements, as f32
// (exact for every dtype that is quantized).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tapegrad/tensor/core/fp8.hpp"
#include "tapegrad/tensor/eigen.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::detail {

// max |x| over x[r0 .. r1) × [c0 .. c1) of a [rows, cols] matrix (NaN if one is NaN).
template <class T>
float amax_of(const Tensor<T>& x, std::int64_t cols, std::int64_t r0, std::int64_t r1, std::int64_t c0,
              std::int64_t c1) {
  float amax = 0.0f;
  for (std::int64_t r = r0; r < r1; ++r) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const float v = std::fabs(convert<float>(x.data()[r * cols + c]));
      amax = std::isnan(v) || std::isnan(amax) ? NAN : std::max(amax, v);
    }
  }
  return amax;
}
template <class T> float amax_of(const Tensor<T>& x) { return amax_of(x, x.numel(), 0, 1, 0, x.numel()); }

// fp8(x · scale) · (1 / scale) in C, element by element, over the given block of `out`.
template <fp8::Format F, class C, class T>
void quantize_block(const Tensor<T>& x, Tensor<C>& out, std::int64_t cols, std::int64_t r0, std::int64_t r1,
                    std::int64_t c0, std::int64_t c1, float scale) {
  const float scale_inv = 1.0f / scale;
  for (std::int64_t r = r0; r < r1; ++r) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t i = r * cols + c;
      const float scaled = convert<float>(x.data()[i]) * scale;
      out.data()[i] = static_cast<C>(fp8::to_float<F>(fp8::from_double<F>(scaled)) * scale_inv);
    }
  }
}

// x [rows, cols] with one scale.
template <class C, class T> Tensor<C> quantized(const Tensor<T>& x, fp8::Format format, float scale) {
  Tensor<C> out(x.shape());
  const std::int64_t n = x.numel();
  parallel_for(n, 8, [&](std::int64_t begin, std::int64_t end) {
    if (format == fp8::Format::e4m3) {
      quantize_block<fp8::Format::e4m3>(x, out, n, 0, 1, begin, end, scale);
    } else {
      quantize_block<fp8::Format::e5m2>(x, out, n, 0, 1, begin, end, scale);
    }
  });
  return out;
}

// x [rows, cols] in e4m3 with a power-of-two scale per tile_rows × tile_cols tile (block scaling). The columns are
// `parts` equal parts (a gated block's [n, F]), each tiled from its own first column.
template <class C, class T>
Tensor<C> block_quantized(const Tensor<T>& x, std::int64_t rows, std::int64_t cols, std::int64_t tile_rows,
                          std::int64_t tile_cols, std::int64_t parts = 1) {
  Tensor<C> out(x.shape());
  const std::int64_t part_cols = cols / parts, tiles_per_part = (part_cols + tile_cols - 1) / tile_cols;
  const std::int64_t tiles_down = (rows + tile_rows - 1) / tile_rows, tiles_across = parts * tiles_per_part;
  parallel_for(tiles_down * tiles_across, tile_rows * tile_cols, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      const std::int64_t across = t % tiles_across, part = across / tiles_per_part;
      const std::int64_t r0 = t / tiles_across * tile_rows, c0 = part * part_cols + across % tiles_per_part * tile_cols;
      const std::int64_t r1 = std::min(rows, r0 + tile_rows), c1 = std::min((part + 1) * part_cols, c0 + tile_cols);
      const float scale = fp8::block_scale(amax_of(x, cols, r0, r1, c0, c1), fp8::max_value<fp8::Format::e4m3>());
      quantize_block<fp8::Format::e4m3>(x, out, cols, r0, r1, c0, c1, scale);
    }
  });
  return out;
}

}  // namespace tapegrad::detail

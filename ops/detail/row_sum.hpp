// Deterministic sums over rows for the CPU kernels (dgamma, dbeta, loss totals). Rows are cut into blocks whose
// size depends only on the problem's shape; each block adds its rows, in order, into its own partial; then the
// partials are added in block order. The thread pool only decides which thread runs which block, so the result is
// bitwise the same for every thread count. Internal to ops/ (installed: expressions sum a broadcast leaf's
// gradient with it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tapegrad/tensor/eigen.hpp"

namespace tapegrad::detail {

// body(begin, end, partial) handles rows [begin, end) and adds their contributions into partial[0, width), which
// starts at zero. Returns the totals over all rows.
template <class C, class Body>
std::vector<C> blocked_row_sum(std::int64_t rows, std::int64_t width, std::int64_t cost_per_row, Body&& body) {
  // Blocks of at least block_cost work, and at most max_blocks of them (which bounds the partials' memory).
  constexpr std::int64_t block_cost = 1 << 14, max_blocks = 128;
  const std::int64_t cost = std::max<std::int64_t>(cost_per_row, 1);
  const std::int64_t rows_per_block =
      std::max({std::int64_t{1}, block_cost / cost, (rows + max_blocks - 1) / max_blocks});
  const std::int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  std::vector<C> partials(static_cast<std::size_t>(blocks * width), C(0));
  parallel_for(blocks, rows_per_block * cost, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t b = first; b < last; ++b) {
      body(b * rows_per_block, std::min(rows, (b + 1) * rows_per_block), partials.data() + b * width);
    }
  });
  std::vector<C> total(static_cast<std::size_t>(width), C(0));
  for (std::int64_t b = 0; b < blocks; ++b) {
    for (std::int64_t j = 0; j < width; ++j)
      total[static_cast<std::size_t>(j)] += partials[static_cast<std::size_t>(b * width + j)];
  }
  return total;
}

// shape.numel() values from `values`, each rounded once to T.
template <class T, class C> Tensor<T> rounded_tensor(const C* values, const Shape& shape) {
  Tensor<T> out(shape);
  std::transform(values, values + shape.numel(), out.data(), [](C v) { return convert<T>(v); });
  return out;
}

}  // namespace tapegrad::detail

// The second stage of a deterministic two-stage reduction over rows (dgamma, dbeta, bias gradients): the first
// stage leaves one partial row per block of rows; this adds them column by column in a fixed order, so the result
// is bitwise the same on every run. Plain C++ (see tensor/gpu/backend.hpp for how ops call it).
#pragma once

#include <cstdint>
#include <span>

#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

// One sum: `partials` holds [blocks, width] in the compute type of the sum's dtype (f64 for f64, f32 otherwise),
// `out` receives [width] in that dtype.
struct PartialSums {
  const void* partials;
  void* out;
};

// The most sums one launch takes (a norm's dγ and dβ, and a caller's column sums over the same rows).
constexpr int max_partial_sums = 3;

// For each sum: out[j] = Σ_b partials[b·width + j] over b in [0, blocks), summed in a fixed order (eight fixed
// slices of the blocks, each in block order, then the slices in order) in the compute type, rounded once to
// `dtype`. With no blocks, zeros. All of `sums` (at most max_partial_sums) run in one launch.
void sum_partials(DType dtype, std::span<const PartialSums> sums, std::int64_t blocks, std::int64_t width,
                  int device);

}  // namespace tapegrad::cuda

// The second stage of a deterministic two-stage reduction over rows (dgamma, dbeta, bias gradients): the first
// stage leaves one partial row per block of rows; this adds them column by column in a fixed order, so the result
// is bitwise the same on every run. Plain C++ (see cuda/enabled.hpp for how ops call it).
#pragma once

#include <cstdint>

#include "tensor/dtype_tag.hpp"

namespace tapegrad::cuda {

// out[j] = Σ_b partials[b·width + j] over b in [0, blocks), summed in a fixed order (eight fixed slices of the
// blocks, each in block order, then the slices in order) in the compute type of `dtype` (f64 for f64, f32
// otherwise; `partials` holds that type), rounded once to `dtype`. With no blocks, zeros.
void sum_partials(DType dtype, const void* partials, std::int64_t blocks, std::int64_t width, void* out, int device);

}  // namespace tapegrad::cuda

// The sum of two device arrays, for gradient accumulation (tensor/detail/accumulate.hpp) and an fp8 product's
// addend. Plain C++ (see tensor/gpu/backend.hpp for how callers reach it).
#pragma once

#include <cstdint>

#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

// out[i] = a[i] + b[i] for i < n (f32, f64, bf16 or f16; the 16-bit types add in f32 and round once to nearest
// even, as the CPU does), on `device`'s current stream. `out` may be `a` or `b`.
void add(DType dtype, const void* a, const void* b, void* out, std::int64_t n, int device);

}  // namespace tapegrad::cuda

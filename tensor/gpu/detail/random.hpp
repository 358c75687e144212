// Random tensors on the GPU. The kernels evaluate the same per-element draws as the CPU
// (tensor/core/detail/random_draws.hpp) and round them the same way, so a device tensor holds the cpu tensor of the
// same seed (bitwise for uniform and integer draws; normal draws within the bound tensor/factories.hpp states). Plain
// C++ (see tensor/gpu/backend.hpp for how callers use it).
#pragma once

#include <cstdint>

#include "tapegrad/tensor/core/dtype_tag.hpp"
#include "tapegrad/tensor/core/detail/random_draws.hpp"

namespace tapegrad::cuda {

// data[i] = draw(i) rounded to `dtype` (f32, f64, bf16 or f16) to nearest even, for i in [0, n), on `device`'s
// current stream; a uniform draw then steps below its `high` (philox::step_below).
void random_fill(DType dtype, void* data, std::int64_t n, const philox::UniformDraw& draw, int device);
void random_fill(DType dtype, void* data, std::int64_t n, const philox::NormalDraw& draw, int device);
void random_fill(DType dtype, void* data, std::int64_t n, const philox::TruncatedNormalDraw& draw, int device);
// data[i] = draw(i) as `dtype` (i32 or i64).
void random_fill(DType dtype, void* data, std::int64_t n, const philox::IntegerDraw& draw, int device);

}  // namespace tapegrad::cuda

// Filling device memory with one value, or a matrix with one value on and below its diagonal and another above
// (a causal mask). Plain C++ (see tensor/gpu/backend.hpp for how ops call it).
#pragma once

#include <cstdint>

#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

// data[0..n) = value rounded to `dtype` (to nearest even), on `device`'s current stream.
void fill(DType dtype, void* data, std::int64_t n, double value, int device);

// The [rows, cols] row-major matrix data(i, j) = j <= i ? lower : upper, each rounded to `dtype` (a causal mask).
void fill_triangular(DType dtype, void* data, std::int64_t rows, std::int64_t cols, double lower, double upper,
                     int device);

}  // namespace tapegrad::cuda

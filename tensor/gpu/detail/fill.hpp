// Filling device memory with one value. Plain C++ (see tensor/gpu/backend.hpp for how ops call it).
#pragma once

#include <cstdint>

#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

// data[0..n) = value rounded to `dtype` (to nearest even), on `device`'s current stream.
void fill(DType dtype, void* data, std::int64_t n, double value, int device);

}  // namespace tapegrad::cuda

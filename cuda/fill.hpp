// Filling device memory with one value. Plain C++ (see cuda/enabled.hpp for how ops call it).
#pragma once

#include <cstdint>

#include "tensor/dtype_tag.hpp"

namespace tapegrad::cuda {

// data[0..n) = value rounded to `dtype` (to nearest even), on `device`'s current stream.
void fill(DType dtype, void* data, std::int64_t n, double value, int device);

}  // namespace tapegrad::cuda

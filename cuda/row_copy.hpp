// Padding and cropping a matrix of rows: how layernorm_mlp gives the GEMMs hidden and ffn sizes that are whole
// 16-byte packs, and takes its results back. Plain C++ (see cuda/enabled.hpp for how ops call it).
#pragma once

#include <cstdint>

#include "tensor/dtype_tag.hpp"

namespace tapegrad::cuda {

// dst [dst_rows, dst_cols] = src [rows, cols] where both have the element (r, c), zero bits elsewhere: one pass
// that pads (dst larger), crops (dst smaller) or both, each side compact and row-major. Elements of `dtype` (any: a
// copy moves bits), on `device`'s current stream.
void copy_rows(DType dtype, const void* src, std::int64_t rows, std::int64_t cols, void* dst, std::int64_t dst_rows,
               std::int64_t dst_cols, int device);

}  // namespace tapegrad::cuda

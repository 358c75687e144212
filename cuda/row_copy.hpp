// Padding and cropping a matrix of rows: how layernorm_mlp gives the GEMMs hidden and ffn sizes that are whole
// 16-byte packs, and takes its results back. Plain C++ (see tensor/gpu/backend.hpp for how ops call it).
#pragma once

#include <cstdint>
#include <span>

#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

// dst [dst_rows, dst_cols] = src [rows, cols] where both have the element (r, c), zero bits elsewhere: one pass
// that pads (dst larger), crops (dst smaller) or both, each side compact and row-major.
struct RowCopy {
  const void* src = nullptr;
  std::int64_t rows = 0, cols = 0;
  void* dst = nullptr;
  std::int64_t dst_rows = 0, dst_cols = 0;
};

constexpr int max_row_copies = 8;

// The copies (at most max_row_copies, none writing what another reads) in one launch, each given a share of the
// blocks by its size: a step's several paddings cost one launch, not one each. Elements of `dtype` (any: a copy
// moves bits), on `device`'s current stream.
void copy_rows(DType dtype, std::span<const RowCopy> copies, int device);

}  // namespace tapegrad::cuda

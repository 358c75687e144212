// Copying between strided views of device memory: the one kernel behind the layout ops on the GPU (permute,
// slice, concat, expand). Plain C++ (see tensor/gpu/backend.hpp for how ops call it).
#pragma once

#include <cstdint>
#include <vector>

#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

// One axis of a copy's index space: its size and, in elements, the step it takes in the source and in the
// destination. A source stride of 0 broadcasts (every index along the axis reads the same element). Strides are
// never negative.
struct CopyAxis {
  std::int64_t dim, src_stride, dst_stride;
};

// For every index (i0, ..., ik) of `axes` (row-major, at most 8 axes):
//   dst[sum i_a · dst_stride_a] = src[sum i_a · src_stride_a],
// on `device`'s current stream. Elements of `dtype` (any, the integer ones included: a copy moves bits). Each
// destination element must be named once (no two indices may write the same one).
void strided_copy(DType dtype, const void* src, void* dst, const std::vector<CopyAxis>& axes, int device);

}  // namespace tapegrad::cuda

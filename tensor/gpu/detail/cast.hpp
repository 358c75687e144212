// Converting device arrays between the floating dtypes, with the CPU's rounding. Plain C++ (see tensor/gpu/backend.hpp
// for how ops call it).
#pragma once

#include <cstdint>

#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

// dst[i] = src[i] converted from `from` to `to` (f32, f64, bf16, f16, f8e4m3 or f8e5m2) for i < n, on `device`'s
// current stream; bitwise what `convert` (tensor/dtype.hpp) gives on the CPU: round to nearest even, f64 to bf16/f16
// correctly rounded, subnormals kept, fp8 as tensor/core/fp8.hpp says. A NaN keeps its sign; its payload goes as on an
// x86 cpu with Eigen's portable bf16/f16 conversions (a bf16 or f16 result is the quiet NaN; an f32 from bf16/f16 keeps
// the payload bits; an f32 or f64 otherwise keeps the payload's leading bits and is quiet), so quiet NaNs without a
// payload match on any cpu.
void cast(DType from, const void* src, DType to, void* dst, std::int64_t n, int device);

}  // namespace tapegrad::cuda

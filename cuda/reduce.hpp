// Reductions of device arrays over a set of axes (sum, mean, max with the position of the maximum), and the two
// small launchers their gradients need. Plain C++ (see tensor/gpu/backend.hpp for how ops call them).
#pragma once

#include <cstdint>
#include <vector>

#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

// A contiguous row-major array of `dims` (at most 8) reduced over the axes where `reduced` is true. The result
// holds the kept axes, row-major, in their order.
struct Reduction {
  std::vector<std::int64_t> dims;
  std::vector<bool> reduced;
};

// y = (the sum over the reduced axes of x) / divisor, accumulated in f64 for f32/f64 and in f32 for bf16/f16 (as
// on the CPU), divided in that type and rounded once to `dtype`, or with wide_output to f32 for bf16/f16 (y then
// holds f32). A reduction over zero elements gives 0 / divisor. The summation order depends only on the dims:
// results are bitwise the same on every run.
void sum(DType dtype, const void* x, const Reduction& r, double divisor, void* y, int device,
         bool wide_output = false);

// y = the maximum over the reduced axes of x (a NaN if there is one), and argmax = the flat index into x of the
// first maximum in row-major order (of the first NaN when there is one). Every reduced group must be non-empty.
void max(DType dtype, const void* x, const Reduction& r, void* y, std::int64_t* argmax, int device);

// dx[argmax[o]] = dy[o] for o < outputs; the rest of dx is left as it is (max's gradient, into zeros).
void scatter_to_argmax(DType dtype, const void* dy, const std::int64_t* argmax, std::int64_t outputs, void* dx,
                       int device);

// y[i] = x[i] / divisor for i < n, divided in compute_of (f32 for bf16/f16) and rounded once (mean's gradient).
void divide(DType dtype, const void* x, double divisor, void* y, std::int64_t n, int device);

}  // namespace tapegrad::cuda

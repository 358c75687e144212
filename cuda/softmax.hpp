// softmax and log_softmax along one axis on the GPU, forward and backward: host launchers in plain C++ (see
// tensor/gpu/backend.hpp for how ops call them). The maths is the CPU's (ops/softmax.cpp), in the compute type C of the
// dtype (f32 for f32/bf16/f16, f64 for f64), stable (each line's max is subtracted), rounded to the dtype once.
//
// x is seen as lines [outer, n, inner] (as ops/detail/lines.hpp): line (o, i) holds the n elements o·n·inner + k·inner
// + i and has index o·inner + i in the per-line statistics. Every pointer is device memory of `device`, contiguous;
// work is queued on the device's current stream.
#pragma once

#include <cstdint>

#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

struct SoftmaxLines {
  std::int64_t outer = 1, n = 1, inner = 1;
};

// y = softmax(x) (log_softmax when `log`) along the lines, of `dtype`. line_max and line_sum (C[outer·inner]):
// each line's max and Σ exp(x - max), which the backward takes.
void softmax_forward(DType dtype, bool log, const SoftmaxLines& lines, const void* x, void* y, void* line_max,
                     void* line_sum, int device);

// dx from x, the forward's line statistics and dy, p = exp(x - max) / sum recomputed in C:
// softmax dx = p·(dy - Σ dy·p); log_softmax dx = dy - p·Σ dy.
void softmax_backward(DType dtype, bool log, const SoftmaxLines& lines, const void* x, const void* line_max,
                      const void* line_sum, const void* dy, void* dx, int device);

}  // namespace tapegrad::cuda

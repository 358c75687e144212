// The sum of two tensors of one shape on one device, the tensor-level operation behind gradient accumulation
// (autodiff/var.cpp): on the cpu an Eigen sum over the thread pool, on a GPU one kernel on its current stream.
#pragma once

#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad {

// a + b in a new tensor (bf16/f16 add in f32 and round once). Throws naming "accumulate" when the shapes or devices
// differ.
template <class T> Tensor<T> sum_of(const Tensor<T>& a, const Tensor<T>& b);

}  // namespace tapegrad

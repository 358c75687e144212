// The sum of two tensors of one shape on one device, the tensor-level operation behind gradient accumulation
// (autodiff/var.cpp): on the cpu an Eigen sum over the thread pool, on a GPU one kernel on its current stream.
#pragma once

#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad {

// total += g (bf16/f16 add in f32 and round once); an undefined total becomes g. The sum is written into total's
// memory when no other tensor shares it, else into a new tensor that total then holds: a gradient may share memory
// with saved tensors, other gradients, or a copy the user kept. Throws naming "accumulate" when the shapes or devices
// differ.
template <class T> void add_to(Tensor<T>& total, const Tensor<T>& g);

}  // namespace tapegrad

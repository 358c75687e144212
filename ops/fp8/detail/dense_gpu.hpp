// fp8_dense on the GPU: the CPU node's products (ops/fp8/dense.cpp) as cuBLASLt FP8 products of codes
// (ops/fp8/detail/device_operand.hpp), with the same roles, scales and roundings. Internal to ops/.
//
// K and N are padded as the recipe's products need (DeviceQuantizer::padded): x, the kernel and the bias padded with
// zeros, y, dx and the kernel's gradient cropped. The backward keeps x's transposed codes (what dkernel reads, one
// byte an element) and the kernel's codes, not their transpose (the forward's product read it).
#pragma once

#include <cstdint>

#include "tapegrad/ops/fp8/detail/device_operand.hpp"
#include "tapegrad/ops/fp8/recipe.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::detail {

template <class T> struct DeviceDense {
  std::int64_t M = 0, K = 0, N = 0, padded_K = 0, padded_N = 0;
  DeviceQuantizer<T> quantizer;
  DeviceOperand<T> x, kernel;  // x [K, M] as dkernel reads it; the kernel [K, N] as dx reads it
};

// y [M, N] = q(x) · q(kernel) + bias; x [M, K] on a GPU in f32, bf16 or f16, the bias null where absent.
template <class T, class P>
Tensor<T> device_dense_forward(DeviceDense<T>& s, const Fp8Quantization& q, const std::optional<fp8::AmaxGroup>& group,
                               const Tensor<T>& x, const Tensor<P>& kernel, const Tensor<P>* bias);

template <class T, class P> struct DeviceDenseGrads {
  Tensor<T> dx;           // [M, K]
  Tensor<P> dkernel, db;  // each undefined unless needed
};

// From dy [M, N]: dx = q(dy) · q(kernel)ᵀ, dkernel = q(x)ᵀ · q(dy), db = Σ_rows dy (summed in f32).
template <class T, class P>
DeviceDenseGrads<T, P> device_dense_backward(const DeviceDense<T>& s, const Tensor<T>& dy, bool need_x,
                                             bool need_kernel, bool need_bias);

}  // namespace tapegrad::detail

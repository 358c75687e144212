// fp8_dense on the GPU: the CPU node's products (ops/fp8_dense.cpp) as cuBLASLt FP8 products of codes
// (ops/fp8_device.hpp), with the same roles, scales and roundings. Internal to ops/.
//
// K and N are padded to 16 elements (block scaling: to whole tiles of 128), as layernorm_mlp pads its sizes
// (ops/layernorm_mlp_gpu.hpp says why): x, the kernel and the bias padded with zeros, y, dx and the kernel's
// gradient cropped. The backward keeps x's transposed codes (what dkernel reads, one byte an element) and the
// kernel's codes.
#pragma once

#include <cstdint>
#include <optional>

#include "tapegrad/ops/fp8.hpp"
#include "tapegrad/ops/fp8_device.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::detail {

template <class T> struct DeviceDense {
  std::int64_t M = 0, K = 0, N = 0, padded_K = 0, padded_N = 0;
  std::optional<DeviceFp8> fp8;
  Fp8Codes x_transposed, kernel;  // x's transposed codes [K, M]; the kernel's codes [K, N] and their transpose
};

// y [M, N] = q(x) · q(kernel) + bias; x [M, K] on a GPU in f32, bf16 or f16, the bias null where absent.
template <class T, class P>
Tensor<T> device_dense_forward(DeviceDense<T>& s, const Fp8Quantization& q, const Tensor<T>& x,
                               const Tensor<P>& kernel, const Tensor<P>* bias);

template <class T, class P> struct DeviceDenseGrads {
  Tensor<T> dx;           // [M, K]
  Tensor<P> dkernel, db;  // each undefined unless needed
};

// From dy [M, N]: dx = q(dy) · q(kernel)ᵀ, dkernel = q(x)ᵀ · q(dy), db = Σ_rows dy (summed in f32).
template <class T, class P>
DeviceDenseGrads<T, P> device_dense_backward(const DeviceDense<T>& s, const Tensor<T>& dy, bool need_x,
                                             bool need_kernel, bool need_bias);

}  // namespace tapegrad::detail

// FP8 on the device, for the kernels that write fp8 codes (cuda/fp8_quantize.cu, cuda/mlp_activation.cu): a value's
// code and a block's amax. Internal to cuda/.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "tapegrad/tensor/core/fp8.hpp"
#include "tapegrad/tensor/gpu/launch.cuh"

namespace tapegrad::cuda {

// The hardware's conversion (round to nearest even, saturating to the largest finite value): tensor/core/fp8.hpp's
// from_double of the same f32, the CPU's; a NaN gives nan_code as there.
template <fp8::Format F> __device__ __forceinline__ std::uint8_t to_fp8(float v) {
  if (v != v) return fp8::nan_code;
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, F == fp8::Format::e4m3 ? __NV_E4M3 : __NV_E5M2);
}

// The bits of |v| as f32: they order as the magnitudes do (NaN above infinity), so their maximum is an amax that no
// order of the threads changes.
template <class S> __device__ __forceinline__ unsigned int abs_bits(S v) {
  return __float_as_uint(fabsf(to_compute<float>(v)));
}

// Merges each thread's m (abs_bits of its values) into *amax_bits: a warp's maximum, then the block's, one atomic
// per block. Called by every thread of the block.
__device__ __forceinline__ void merge_amax(unsigned int m, unsigned int* amax_bits) {
  m = __reduce_max_sync(0xffffffffu, m);
  __shared__ unsigned int warps[32];
  const unsigned threads = blockDim.x * blockDim.y, thread = threadIdx.y * blockDim.x + threadIdx.x;
  const unsigned lane = thread % 32, warp = thread / 32;
  if (lane == 0) warps[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < threads / 32 ? warps[lane] : 0u;
    m = __reduce_max_sync(0xffffffffu, m);
    if (lane == 0) atomicMax(amax_bits, m);
  }
}

}  // namespace tapegrad::cuda

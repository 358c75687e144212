// FP8 on the device, for the kernels that write fp8 codes (cuda/fp8_quantize.cu, cuda/mlp_activation*.cu): a value's
// code, a block's amax and a run's loads. Internal to cuda/.
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

// x[0 .. R) as f32, from 16-byte loads (x 16-byte aligned): the runs of R elements the fp8 kernels convert together.
template <int R, class S> __device__ __forceinline__ void load_run(const S* x, float (&v)[R]) {
  static_assert(sizeof(S) * R % 16 == 0);
  constexpr int per_load = 16 / sizeof(S);
  for (int k = 0; k < R / per_load; ++k) {
    const uint4 bits = *reinterpret_cast<const uint4*>(x + k * per_load);
    const S* values = reinterpret_cast<const S*>(&bits);
    for (int j = 0; j < per_load; ++j) v[k * per_load + j] = to_compute<float>(values[j]);
  }
}

}  // namespace tapegrad::cuda

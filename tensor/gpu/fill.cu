#include "tapegrad/tensor/gpu/detail/fill.hpp"

#include "tapegrad/tensor/gpu/detail/launch.cuh"

namespace tapegrad::cuda {

namespace {

template <class S> __global__ void fill_kernel(S* data, std::int64_t n, S value) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    data[i] = value;
  }
}

// The value rounded to S on the host: every element gets the same bits.
template <class S> S rounded(double value) {
  if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    return __double2bfloat16(value);
  } else if constexpr (std::is_same_v<S, __half>) {
    return __double2half(value);
  } else {
    return static_cast<S>(value);
  }
}

}  // namespace

void fill(DType dtype, void* data, std::int64_t n, double value, int device) {
  if (n == 0) return;
  Launch launch(device);
  dispatch_float(dtype, "fill", [&](auto tag) {
    using S = decltype(tag);
    constexpr int threads = 256;
    fill_kernel<S><<<launch.blocks_for(n, threads), threads, 0, launch.stream()>>>(static_cast<S*>(data), n,
                                                                                    rounded<S>(value));
    TAPEGRAD_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace tapegrad::cuda

// A grid-stride loop, a pack of 16 bytes per step where the three arrays allow it.
#include "tapegrad/tensor/gpu/detail/add.hpp"

#include "tapegrad/tensor/gpu/detail/launch.cuh"

namespace tapegrad::cuda {

namespace {

template <class S, int V>
__global__ void add_kernel(const S* __restrict__ a, const S* __restrict__ b, S* out, std::int64_t n) {
  using C = compute_of<S>;
  const std::int64_t packs = n / V, stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t p = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; p < packs; p += stride) {
    const Pack<S, V> x = reinterpret_cast<const Pack<S, V>*>(a)[p], y = reinterpret_cast<const Pack<S, V>*>(b)[p];
    Pack<S, V> sum;
#pragma unroll
    for (int k = 0; k < V; ++k) sum.v[k] = from_compute<S>(to_compute<C>(x.v[k]) + to_compute<C>(y.v[k]));
    reinterpret_cast<Pack<S, V>*>(out)[p] = sum;
  }
  // The tail past the last whole pack.
  for (std::int64_t i = packs * V + blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += stride) {
    out[i] = from_compute<S>(to_compute<C>(a[i]) + to_compute<C>(b[i]));
  }
}

}  // namespace

void add(DType dtype, const void* a, const void* b, void* out, std::int64_t n, int device) {
  if (n == 0) return;
  Launch launch(device);
  dispatch_float(dtype, "add", [&](auto tag) {
    using S = decltype(tag);
    constexpr int threads = 256, V = 16 / sizeof(S);
    const auto* sa = static_cast<const S*>(a);
    const auto* sb = static_cast<const S*>(b);
    auto* so = static_cast<S*>(out);
    if (aligned_16(a) && aligned_16(b) && aligned_16(out)) {
      add_kernel<S, V><<<launch.blocks_for(n / V + 1, threads), threads, 0, launch.stream()>>>(sa, sb, so, n);
    } else {
      add_kernel<S, 1><<<launch.blocks_for(n, threads), threads, 0, launch.stream()>>>(sa, sb, so, n);
    }
    TAPEGRAD_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace tapegrad::cuda

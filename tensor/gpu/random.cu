// Random fills: one thread per element, each evaluating its element's draw from (seed, index) alone, so no thread
// depends on another and the result does not depend on the grid. (Each element computes the whole Philox block it
// takes 32 bits from, as the CPU does: fills are rare next to training, and this keeps the formula shared.)
#include "tapegrad/tensor/gpu/detail/random.hpp"

#include <type_traits>

#include "tapegrad/tensor/gpu/detail/launch.cuh"

namespace tapegrad::cuda {

namespace {

// Element i in storage type S: the draw rounded to nearest even (a uniform draw then steps below its `high`).
template <class S, class Draw> __device__ S rounded_draw(const Draw& draw, std::uint64_t i) {
  const S value = from_compute<S>(draw(i));
  if constexpr (std::is_same_v<Draw, philox::UniformDraw>) {
    return philox::step_below(value, to_compute<double>(value), draw.high, from_compute<S>(draw.top));
  } else {
    return value;
  }
}

template <class S, class Draw> __global__ void random_fill_kernel(S* out, std::int64_t n, Draw draw) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    out[i] = rounded_draw<S>(draw, static_cast<std::uint64_t>(i));
  }
}

template <class S, class Draw> void launch_fill(void* data, std::int64_t n, const Draw& draw, int device) {
  if (n == 0) return;
  Launch launch(device);
  constexpr int threads = 256;
  random_fill_kernel<S><<<launch.blocks_for(n, threads), threads, 0, launch.stream()>>>(static_cast<S*>(data), n,
                                                                                        draw);
  TAPEGRAD_CUDA_CHECK_LAUNCH();
}

template <class Draw> void fill_float(DType dtype, void* data, std::int64_t n, const Draw& draw, int device) {
  dispatch_float(dtype, "random_fill", [&](auto tag) { launch_fill<decltype(tag)>(data, n, draw, device); });
}

}  // namespace

void random_fill(DType dtype, void* data, std::int64_t n, const philox::UniformDraw& draw, int device) {
  fill_float(dtype, data, n, draw, device);
}
void random_fill(DType dtype, void* data, std::int64_t n, const philox::NormalDraw& draw, int device) {
  fill_float(dtype, data, n, draw, device);
}
void random_fill(DType dtype, void* data, std::int64_t n, const philox::TruncatedNormalDraw& draw, int device) {
  fill_float(dtype, data, n, draw, device);
}

void random_fill(DType dtype, void* data, std::int64_t n, const philox::IntegerDraw& draw, int device) {
  switch (dtype) {
    case DType::i32: return launch_fill<std::int32_t>(data, n, draw, device);
    case DType::i64: return launch_fill<std::int64_t>(data, n, draw, device);
    default: check(false, "random_fill", "integer draws fill i32 or i64 tensors, not ", dtype_name(dtype));
  }
}

}  // namespace tapegrad::cuda

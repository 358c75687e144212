// FP8 quantization kernels (see fp8_quantize.hpp). The codes come from tensor/core/fp8.hpp's from_double applied to
// the f32 product x · scale, as the CPU computes it, so both give the same bits. The transposed copy goes through a
// 32 × 32 tile in shared memory, so that both the codes and their transpose are written a row of a tile at a time.
#include "tapegrad/cuda/fp8_quantize.hpp"

#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/core/fp8.hpp"
#include "tapegrad/tensor/gpu/launch.cuh"

namespace tapegrad::cuda {

namespace {

constexpr int tile = 32;
constexpr int tile_rows_per_pass = 8;  // a block is tile × tile_rows_per_pass threads

template <class S> __global__ void amax_kernel(const S* x, std::int64_t n, unsigned int* amax_bits) {
  unsigned int m = 0;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    m = max(m, __float_as_uint(fabsf(to_compute<float>(x[i]))));
  }
  m = __reduce_max_sync(0xffffffffu, m);
  __shared__ unsigned int warps[32];
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warps[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < blockDim.x / 32 ? warps[lane] : 0u;
    m = __reduce_max_sync(0xffffffffu, m);
    if (lane == 0) atomicMax(amax_bits, m);
  }
}

__global__ void current_scale_kernel(const float* amax, float max, float* scale, float* scale_inv) {
  const float s = fp8::current_scale(*amax, max);
  *scale = s;
  *scale_inv = 1.0f / s;
}

template <class S, fp8::Format F>
__global__ void quantize_kernel(const S* x, std::int64_t rows, std::int64_t cols, const float* scale_ptr,
                                std::uint8_t* codes, std::uint8_t* transposed) {
  __shared__ std::uint8_t block[tile][tile + 1];
  const float scale = *scale_ptr;
  const std::int64_t tiles_across = (cols + tile - 1) / tile, tiles = tiles_across * ((rows + tile - 1) / tile);
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::int64_t r0 = t / tiles_across * tile, c0 = t % tiles_across * tile;
    for (int i = threadIdx.y; i < tile; i += tile_rows_per_pass) {
      const std::int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) {
        const float scaled = to_compute<float>(x[r * cols + c]) * scale;
        const std::uint8_t code = fp8::from_double<F>(static_cast<double>(scaled));
        codes[r * cols + c] = code;
        block[i][threadIdx.x] = code;
      }
    }
    if (transposed == nullptr) continue;  // (the same for every thread of the block)
    __syncthreads();
    for (int i = threadIdx.y; i < tile; i += tile_rows_per_pass) {
      const std::int64_t c = c0 + i, r = r0 + threadIdx.x;
      if (r < rows && c < cols) transposed[c * rows + r] = block[threadIdx.x][i];
    }
    __syncthreads();  // the tile is read before the next one overwrites it
  }
}

fp8::Format format_of(DType format, const char* op) {
  check(is_fp8(format), op, "the format must be f8e4m3 or f8e5m2, got ", dtype_name(format));
  return format == DType::f8e4m3 ? fp8::Format::e4m3 : fp8::Format::e5m2;
}

// Calls fn(S{}) for the storage type of a dtype that is quantized: f32, bf16 or f16.
template <class Fn> void dispatch_quantized(DType dtype, const char* op, Fn&& fn) {
  check(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, op, "quantizes f32, bf16 or f16, not ",
        dtype_name(dtype));
  dispatch_float(dtype, op, fn);
}

}  // namespace

void fp8_amax(DType dtype, const void* x, std::int64_t n, float* amax, int device) {
  check(n >= 0, "fp8_amax", "negative element count ", n);
  if (n == 0) return;
  const Launch launch(device);
  dispatch_quantized(dtype, "fp8_amax", [&](auto tag) {
    using S = decltype(tag);
    constexpr int threads = 512;
    amax_kernel<S><<<launch.blocks_for(n, threads), threads, 0, launch.stream()>>>(
        static_cast<const S*>(x), n, reinterpret_cast<unsigned int*>(amax));
    TAPEGRAD_CUDA_CHECK_LAUNCH();
  });
}

void fp8_current_scale(const float* amax, DType format, float* scale, float* scale_inv, int device) {
  const float max = fp8::max_value(format_of(format, "fp8_current_scale"));
  const Launch launch(device);
  current_scale_kernel<<<1, 1, 0, launch.stream()>>>(amax, max, scale, scale_inv);
  TAPEGRAD_CUDA_CHECK_LAUNCH();
}

void fp8_quantize(DType dtype, const void* x, std::int64_t rows, std::int64_t cols, DType format, const float* scale,
                  void* codes, void* transposed, int device) {
  check(rows >= 0 && cols >= 0, "fp8_quantize", "negative size [", rows, ", ", cols, "]");
  const fp8::Format f = format_of(format, "fp8_quantize");
  if (rows == 0 || cols == 0) return;
  const Launch launch(device);
  dispatch_quantized(dtype, "fp8_quantize", [&](auto tag) {
    using S = decltype(tag);
    const std::int64_t tiles = ((rows + tile - 1) / tile) * ((cols + tile - 1) / tile);
    const dim3 threads(tile, tile_rows_per_pass);
    const int blocks = launch.blocks_for(tiles * tile * tile_rows_per_pass, tile * tile_rows_per_pass);
    const auto run = [&](auto kernel) {
      kernel<<<blocks, threads, 0, launch.stream()>>>(static_cast<const S*>(x), rows, cols, scale,
                                                      static_cast<std::uint8_t*>(codes),
                                                      static_cast<std::uint8_t*>(transposed));
      TAPEGRAD_CUDA_CHECK_LAUNCH();
    };
    if (f == fp8::Format::e4m3) {
      run(quantize_kernel<S, fp8::Format::e4m3>);
    } else {
      run(quantize_kernel<S, fp8::Format::e5m2>);
    }
  });
}

}  // namespace tapegrad::cuda

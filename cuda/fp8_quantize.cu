// FP8 quantization kernels (see fp8_quantize.hpp). A code is to_fp8 (cuda/fp8_codes.cuh) of the f32 product
// x · scale, as the CPU computes it. The quantization works on tiles of 64 × 64 elements: each thread loads two
// runs of 8 elements of a row (16- or 32-byte loads, both in flight at once) and converts them in pairs (8-byte stores
// of codes), the tile's codes go through shared memory as 4-byte words, and runs of 8 codes down a column are written
// as 8 bytes of the transpose. Quantized over itself (fp8_quantize_over), a row is read and written by one block, a
// chunk of it at a time from its start.
#include "tapegrad/cuda/fp8_quantize.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "tapegrad/cuda/fp8_codes.cuh"
#include "tapegrad/cuda/settings.hpp"
#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::cuda {

namespace {

constexpr int tile = 64;
constexpr int run = 8;  // elements a thread converts together
constexpr int quantize_threads = 256;
constexpr int runs_per_tile = tile * tile / run;
constexpr int runs_per_thread = runs_per_tile / quantize_threads;

// x's first `head` elements (up to a 16-byte boundary) and its last ones one at a time, the packs of 16 bytes between
// them whole: a warp's loads are 512 bytes, not 64 (one bf16 each moved a quarter of the memory's bandwidth).
template <class S>
__global__ void amax_kernel(const S* x, std::int64_t n, std::int64_t head, unsigned int* amax_bits) {
  wait_for_prior_kernels();
  constexpr int V = 16 / sizeof(S);
  const std::int64_t thread = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  const std::int64_t threads = std::int64_t{gridDim.x} * blockDim.x;
  const std::int64_t packs = (n - head) / V, tail = head + packs * V;
  unsigned int m = 0;
  if (thread < head) m = abs_bits(x[thread]);
  for (std::int64_t i = thread; i < packs; i += threads) {
    const uint4 bits = *reinterpret_cast<const uint4*>(x + head + i * V);
    const S* values = reinterpret_cast<const S*>(&bits);
#pragma unroll
    for (int j = 0; j < V; ++j) m = max(m, abs_bits(values[j]));
  }
  if (tail + thread < n) m = max(m, abs_bits(x[tail + thread]));
  merge_amax(m, amax_bits);
}

// What quantize_kernel reads and writes: fp8_quantize's arguments, resolved. `x_aligned`: x_cols a multiple of run
// and x at a 16-byte boundary (whole runs load at once); `codes_aligned`, `transposed_aligned`: likewise cols, or
// transposed_ld, and the codes at 8-byte boundaries (whole runs store at once).
template <class S> struct Job {
  const S* x;
  std::int64_t x_rows, x_cols;  // zeros past them
  std::int64_t rows, cols;      // the codes'
  const float* scale;
  Fp8CurrentScale current;
  std::uint8_t* codes;
  std::uint8_t* transposed;
  std::int64_t transposed_ld;
  unsigned int* amax_bits;
  bool x_aligned, codes_aligned, transposed_aligned;
};

// Tiles over [padded_rows, cols], padded_rows = transposed_ld where there is a transposed copy (its rows past `rows`
// are zero codes), else rows. With current.amax, every block makes the scale from it and the first writes it out.
template <class S, fp8::Format F> __global__ void __launch_bounds__(quantize_threads) quantize_kernel(const Job<S> j) {
  __shared__ alignas(16) std::uint8_t block[tile][tile + 4];
  wait_for_prior_kernels();
  const float scale = j.current.amax ? fp8::current_scale(*j.current.amax, fp8::max_value<F>()) : *j.scale;
  if (j.current.amax && blockIdx.x == 0 && threadIdx.x == 0) {
    *j.current.scale = scale;
    *j.current.scale_inv = 1.0f / scale;
  }
  const std::int64_t padded_rows = j.transposed ? j.transposed_ld : j.rows;
  const std::int64_t tiles_across = (j.cols + tile - 1) / tile;
  const std::int64_t tiles = tiles_across * ((padded_rows + tile - 1) / tile);
  unsigned int m = 0;
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::int64_t r0 = t / tiles_across * tile, c0 = t % tiles_across * tile;
    // The thread's runs, all loads first (in flight together), then their codes.
    float v[runs_per_thread][run];
#pragma unroll
    for (int u = 0; u < runs_per_thread; ++u) {
      const int k = threadIdx.x + u * quantize_threads, i = k / (tile / run), c = k % (tile / run) * run;
      load_run_or_zeros(j.x, j.x_rows, j.x_cols, r0 + i, c0 + c, j.x_aligned, v[u]);
    }
#pragma unroll
    for (int u = 0; u < runs_per_thread; ++u) {
      const int k = threadIdx.x + u * quantize_threads, i = k / (tile / run), c = k % (tile / run) * run;
      for (int e = 0; e < run; ++e) m = max(m, __float_as_uint(fabsf(v[u][e])));
      const uint2 q = to_fp8_run<F>(v[u], scale);
      if (j.transposed) store_tile_run(block, i, c, q);
      if (j.codes) {
        const std::int64_t r = r0 + i;
        store_run(j.codes, j.rows, j.cols, r, c0 + c, j.codes_aligned && r < j.rows && c0 + c + run <= j.cols, q);
      }
    }
    if (j.transposed == nullptr) continue;  // (the same for every thread of the block)
    __syncthreads();
    store_transposed(block, r0, c0, j.cols, padded_rows, j.transposed, j.transposed_ld, j.transposed_aligned);
    __syncthreads();  // the tile is read before the next one overwrites it
  }
  if (j.amax_bits) merge_amax(m, j.amax_bits);  // (the same for every thread of the block)
}

// Each block takes whole rows; of a row, chunks of over_threads runs in order, each chunk's loads, a barrier, then its
// codes. A chunk's codes land on bytes that held elements of that chunk or an earlier one (a code takes no more bytes
// than an element), all loaded before the barrier; a later chunk's elements lie past them. The scale and the amax as
// quantize_kernel's.
constexpr int over_threads = 256;
template <class S> struct OverJob {
  S* x;
  std::int64_t rows, cols;
  const float* scale;
  Fp8CurrentScale current;
  unsigned int* amax_bits;
};
template <class S, fp8::Format F>
__global__ void __launch_bounds__(over_threads) quantize_over_kernel(const OverJob<S> j) {
  wait_for_prior_kernels();
  const float scale = j.current.amax ? fp8::current_scale(*j.current.amax, fp8::max_value<F>()) : *j.scale;
  if (j.current.amax && blockIdx.x == 0 && threadIdx.x == 0) {
    *j.current.scale = scale;
    *j.current.scale_inv = 1.0f / scale;
  }
  unsigned int m = 0;
  for (std::int64_t r = blockIdx.x; r < j.rows; r += gridDim.x) {
    S* row = j.x + r * j.cols;
    for (std::int64_t c0 = 0; c0 < j.cols; c0 += over_threads * run) {
      const std::int64_t c = c0 + threadIdx.x * run;
      float v[run];
      if (c < j.cols) load_run(row + c, v);
      __syncthreads();
      if (c < j.cols) {
        for (int e = 0; e < run; ++e) m = max(m, __float_as_uint(fabsf(v[e])));
        *reinterpret_cast<uint2*>(reinterpret_cast<std::uint8_t*>(row) + c) = to_fp8_run<F>(v, scale);
      }
    }
  }
  if (j.amax_bits) merge_amax(m, j.amax_bits);  // (the same for every thread of the block)
}

// Tiles of codes as quantize_kernel's: each thread's runs of 8 codes of a row (8-byte loads where aligned; zeros past
// the rows and columns), the tile through shared memory, its columns' runs written as 8 bytes of the transpose.
struct TransposeJob {
  const std::uint8_t* codes;
  std::int64_t rows, cols, ld;
  std::uint8_t* transposed;
  std::int64_t transposed_ld;
  bool aligned, transposed_aligned;
};
__global__ void __launch_bounds__(quantize_threads) transpose_codes_kernel(const TransposeJob j) {
  __shared__ alignas(16) std::uint8_t block[tile][tile + 4];
  wait_for_prior_kernels();
  const std::int64_t tiles_across = (j.cols + tile - 1) / tile;
  const std::int64_t tiles = tiles_across * ((j.transposed_ld + tile - 1) / tile);
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::int64_t r0 = t / tiles_across * tile, c0 = t % tiles_across * tile;
#pragma unroll
    for (int u = 0; u < runs_per_thread; ++u) {
      const int k = threadIdx.x + u * quantize_threads, i = k / (tile / run), c = k % (tile / run) * run;
      const std::int64_t r = r0 + i, col = c0 + c;
      uint2 q = make_uint2(0, 0);
      if (r < j.rows && j.aligned && col + run <= j.cols) {
        q = *reinterpret_cast<const uint2*>(j.codes + r * j.ld + col);
      } else if (r < j.rows) {
        auto* bytes = reinterpret_cast<std::uint8_t*>(&q);
        for (int e = 0; e < run && col + e < j.cols; ++e) bytes[e] = j.codes[r * j.ld + col + e];
      }
      store_tile_run(block, i, c, q);
    }
    __syncthreads();
    store_transposed(block, r0, c0, j.cols, j.transposed_ld, j.transposed, j.transposed_ld, j.transposed_aligned);
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
    const auto misalignment = reinterpret_cast<std::uintptr_t>(x) % 16;
    const std::int64_t head = std::min<std::int64_t>(n, misalignment == 0 ? 0 : (16 - misalignment) / sizeof(S));
    const int blocks = launch.blocks_for((n - head) / (16 / sizeof(S)) + 1, threads);
    launch_overlapped(launch, amax_kernel<S>, blocks, threads, 0, static_cast<const S*>(x), n, head,
                      reinterpret_cast<unsigned int*>(amax));
  });
}

void fp8_quantize(const Fp8Quantize& q, int device) {
  check(q.rows >= 0 && q.cols >= 0, "fp8_quantize", "negative size [", q.rows, ", ", q.cols, "]");
  const std::int64_t rows = q.codes_rows == 0 ? q.rows : q.codes_rows, cols = q.codes_cols == 0 ? q.cols : q.codes_cols;
  check(rows >= q.rows && cols >= q.cols, "fp8_quantize", "codes [", rows, ", ", cols, "] cannot hold x [", q.rows,
        ", ", q.cols, "]");
  const fp8::Format f = format_of(q.format, "fp8_quantize");
  const std::int64_t transposed_ld = q.transposed_ld == 0 ? rows : q.transposed_ld;
  check(!q.transposed || transposed_ld >= rows, "fp8_quantize", "the transposed codes' rows (", transposed_ld,
        ") are shorter than the codes' ", rows, " rows");
  check(!q.current || (q.current->amax && q.current->scale && q.current->scale_inv), "fp8_quantize",
        "current scaling needs an amax to make the scale from, and where to write it and its inverse");
  const std::int64_t padded_rows = q.transposed ? transposed_ld : rows;
  if ((padded_rows == 0 || cols == 0) && !q.current) return;
  const Launch launch(device);
  const auto at = [](const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; };
  dispatch_quantized(q.dtype, "fp8_quantize", [&](auto tag) {
    using S = decltype(tag);
    const Job<S> job{.x = static_cast<const S*>(q.x),
                     .x_rows = q.rows,
                     .x_cols = q.cols,
                     .rows = rows,
                     .cols = cols,
                     .scale = q.scale,
                     .current = q.current ? *q.current : Fp8CurrentScale{},
                     .codes = static_cast<std::uint8_t*>(q.codes),
                     .transposed = static_cast<std::uint8_t*>(q.transposed),
                     .transposed_ld = transposed_ld,
                     .amax_bits = reinterpret_cast<unsigned int*>(q.amax),
                     .x_aligned = q.cols % run == 0 && at(q.x, 16),
                     .codes_aligned = cols % run == 0 && at(q.codes, 8),
                     .transposed_aligned = transposed_ld % run == 0 && at(q.transposed, 8)};
    const std::int64_t tiles = ((padded_rows + tile - 1) / tile) * ((cols + tile - 1) / tile);
    const int blocks = launch.blocks_for(tiles * quantize_threads, quantize_threads);
    if (f == fp8::Format::e4m3) {
      launch_overlapped(launch, quantize_kernel<S, fp8::Format::e4m3>, blocks, quantize_threads, 0, job);
    } else {
      launch_overlapped(launch, quantize_kernel<S, fp8::Format::e5m2>, blocks, quantize_threads, 0, job);
    }
  });
}

void fp8_transpose(const void* codes, std::int64_t rows, std::int64_t cols, std::int64_t ld, void* transposed,
                   std::int64_t transposed_ld, int device) {
  constexpr const char* op = "fp8_transpose";
  check(rows >= 0 && cols >= 0 && ld >= cols && transposed_ld >= rows, op, "codes [", rows, ", ", cols, "] with rows ",
        ld, " bytes apart cannot be transposed into rows of ", transposed_ld);
  if (cols == 0 || transposed_ld == 0) return;
  const Launch launch(device);
  const auto at = [](const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; };
  const TransposeJob job{.codes = static_cast<const std::uint8_t*>(codes),
                         .rows = rows,
                         .cols = cols,
                         .ld = ld,
                         .transposed = static_cast<std::uint8_t*>(transposed),
                         .transposed_ld = transposed_ld,
                         .aligned = ld % run == 0 && at(codes, 8),
                         .transposed_aligned = transposed_ld % run == 0 && at(transposed, 8)};
  const std::int64_t tiles = ((transposed_ld + tile - 1) / tile) * ((cols + tile - 1) / tile);
  launch_overlapped(launch, transpose_codes_kernel, launch.blocks_for(tiles * quantize_threads, quantize_threads),
                    quantize_threads, 0, job);
}

void fp8_quantize_over(const Fp8QuantizeOver& q, int device) {
  constexpr const char* op = "fp8_quantize_over";
  check(q.rows >= 0 && q.cols >= 0, op, "negative size [", q.rows, ", ", q.cols, "]");
  check(q.cols % run == 0 && reinterpret_cast<std::uintptr_t>(q.x) % 16 == 0, op,
        "quantizes rows of a multiple of ", run, " elements from a 16-byte boundary, not ", q.cols);
  check(q.scale != nullptr || q.current, op, "needs the scale to quantize by");
  check(!q.current || (q.current->amax && q.current->scale && q.current->scale_inv), op,
        "current scaling needs an amax to make the scale from, and where to write it and its inverse");
  const fp8::Format f = format_of(q.format, op);
  if ((q.rows == 0 || q.cols == 0) && !q.current) return;
  const Launch launch(device);
  dispatch_quantized(q.dtype, op, [&](auto tag) {
    using S = decltype(tag);
    const int blocks = std::max(1, launch.blocks_for(q.rows * over_threads, over_threads));
    const OverJob<S> job{.x = static_cast<S*>(q.x),
                         .rows = q.rows,
                         .cols = q.cols,
                         .scale = q.scale,
                         .current = q.current ? *q.current : Fp8CurrentScale{},
                         .amax_bits = reinterpret_cast<unsigned int*>(q.amax)};
    if (f == fp8::Format::e4m3) {
      launch_overlapped(launch, quantize_over_kernel<S, fp8::Format::e4m3>, blocks, over_threads, 0, job);
    } else {
      launch_overlapped(launch, quantize_over_kernel<S, fp8::Format::e5m2>, blocks, over_threads, 0, job);
    }
  });
}

namespace {
std::atomic<Fp8Dispatch> dispatch{Fp8Dispatch::where_it_pays};
}  // namespace

void set_fp8_dispatch(Fp8Dispatch d) { dispatch.store(d, std::memory_order_relaxed); }
Fp8Dispatch fp8_dispatch() { return dispatch.load(std::memory_order_relaxed); }

}  // namespace tapegrad::cuda

// FP8 quantization kernels (see fp8_quantize.hpp). A code is to_fp8 (cuda/fp8_codes.cuh) of the f32 product
// x · scale, as the CPU computes it. The quantization works on tiles of 64 × 64 elements: each thread converts two
// runs of 8 elements of a row in pairs (8-byte stores of codes), the runs of its next tiles already on their way into
// shared memory (cp.async: the kernel, bound by latency at 64 registers a thread, keeps DRAM busy), the tile's codes
// go through shared memory as 4-byte words, and runs of 8 codes down a column are written as 8 bytes of the transpose;
// the column sums of x (a bias gradient) can come from the same pass. Quantized over itself (fp8_quantize_over), a row
// is read and written by one block, a chunk of it at a time from its start.
#include "tapegrad/cuda/fp8_quantize.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "tapegrad/cuda/async_copy.cuh"
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
// quantize_kernel's bands of rows of tiles (see corner there).
constexpr unsigned int band_tiles = 16;

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
  float* column_partials;
  bool x_aligned, codes_aligned, transposed_aligned;
};

constexpr int warps = quantize_threads / 32;

// Tiles a thread's copies run ahead of its conversions (cp.async): a tile's runs are 8 KiB of 16-bit x, 16 KiB of
// f32, so that a few blocks an SM keep ~64 KiB of x in flight whatever the kernel's register count. (f64, which
// dispatch_quantized refuses, only compiles.)
template <class S> constexpr int quantize_stages = sizeof(S) == 2 ? 3 : sizeof(S) == 4 ? 2 : 1;

// The column sums of a tile's values, its first half: each thread adds its two runs (the same 8 columns of rows i and
// i + 32), the four lanes of a warp that hold those columns add theirs, and lanes 0 .. 7 write the warp's sums.
__device__ __forceinline__ void sum_warp_columns(const float (&v)[runs_per_thread][run],
                                                 float (&warp_sums)[warps][tile]) {
  static_assert(runs_per_thread == 2 && quantize_threads % (tile / run) == 0, "a thread's runs share their columns");
  float sums[run];
#pragma unroll
  for (int e = 0; e < run; ++e) {
    sums[e] = v[0][e] + v[1][e];
    sums[e] += __shfl_xor_sync(0xffffffffu, sums[e], 8);
    sums[e] += __shfl_xor_sync(0xffffffffu, sums[e], 16);
  }
  if (threadIdx.x % 32 < tile / run) {
#pragma unroll
    for (int e = 0; e < run; ++e) warp_sums[threadIdx.x / 32][threadIdx.x % (tile / run) * run + e] = sums[e];
  }
}

// Tiles over [padded_rows, cols], padded_rows = transposed_ld where there is a transposed copy (its rows past `rows`
// are zero codes), else rows; a block takes every gridDim.x-th tile, each thread's whole runs of x copied into shared
// memory `stages` tiles ahead (the runs past x's edges, or of x not 16-byte aligned, loaded when converted). With
// current.amax, every block makes the scale from it and the first writes it out. SumColumns: one row of x's column
// sums per row of tiles, the warps' sums added in order (a fixed order: the same sums every run).
template <class S, fp8::Format F, bool SumColumns>
__global__ void __launch_bounds__(quantize_threads) quantize_kernel(const Job<S> j) {
  using Run = Pack<S, run>;
  constexpr int stages = quantize_stages<S>, copies_per_run = sizeof(Run) / 16;
  __shared__ alignas(16) std::uint8_t block[tile][tile + 4];
  __shared__ Run staging[stages][runs_per_thread][quantize_threads];  // each thread's own runs: no barrier for them
  __shared__ float warp_sums[SumColumns ? warps : 1][tile];
  wait_for_prior_kernels();
  const float scale = j.current.amax ? fp8::current_scale(*j.current.amax, fp8::max_value<F>()) : *j.scale;
  if (j.current.amax && blockIdx.x == 0 && threadIdx.x == 0) {
    *j.current.scale = scale;
    *j.current.scale_inv = 1.0f / scale;
  }
  const std::int64_t padded_rows = j.transposed ? j.transposed_ld : j.rows;
  const std::int64_t tiles_across = (j.cols + tile - 1) / tile, tiles_down = (padded_rows + tile - 1) / tile;
  const std::int64_t tiles = tiles_across * tiles_down;
  // Tile t's first row and column: bands of band_tiles rows of tiles, each taken down its rows first, then across, so
  // that the tiles in flight write runs of a transpose's rows band_tiles tiles long and read runs of x's rows as many
  // tiles wide as the band's tiles in flight span (in 32 bits, which hold the tiles' count: fp8_quantize checks it).
  // Measured on an H100 against rows of tiles: codes and transpose 4 % faster at [8192, 12288] and [8192, 16384],
  // codes alone 4-6 % slower: without a transpose the bands are one row of tiles (rows of tiles, in order).
  const unsigned int band_rows = j.transposed ? band_tiles : 1u;
  const auto corner = [&](std::int64_t t) {
    const auto across = static_cast<unsigned int>(tiles_across), k = static_cast<unsigned int>(t);
    const unsigned int band = k / (band_rows * across), first = band * band_rows;
    const unsigned int height = min(static_cast<unsigned int>(tiles_down) - first, band_rows);
    const unsigned int in_band = k - band * band_rows * across;
    return make_longlong2(std::int64_t{first + in_band % height} * tile, std::int64_t{in_band / height} * tile);
  };
  // Run u of the thread in the tile at `at`: its row and column in x, and whether it lies whole inside x (copied
  // ahead).
  const auto row_of = [&](longlong2 at, int u) { return at.x + (threadIdx.x + u * quantize_threads) / (tile / run); };
  const auto column_of = [&](longlong2 at, int u) {
    return at.y + (threadIdx.x + u * quantize_threads) % (tile / run) * run;
  };
  const auto whole = [&](std::int64_t r, std::int64_t c) { return j.x_aligned && r < j.x_rows && c + run <= j.x_cols; };
  // Tile t's whole runs into `stage`, as one group of copies (an empty group past the last tile).
  const auto fetch = [&](std::int64_t t, int stage) {
    if (t < tiles) {
      const longlong2 at = corner(t);
#pragma unroll
      for (int u = 0; u < runs_per_thread; ++u) {
        const std::int64_t r = row_of(at, u), c = column_of(at, u);
        if (!whole(r, c)) continue;
        const uint4* from = reinterpret_cast<const uint4*>(j.x + r * j.x_cols + c);
        uint4* to = reinterpret_cast<uint4*>(&staging[stage][u][threadIdx.x]);
#pragma unroll
        for (int h = 0; h < copies_per_run; ++h) copy_16_async(to + h, from + h);
      }
    }
    commit_async_copies();
  };
  for (int stage = 0; stage < stages; ++stage) fetch(blockIdx.x + std::int64_t{stage} * gridDim.x, stage);
  unsigned int m = 0;
  int stage = 0;
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x, stage = stage + 1 == stages ? 0 : stage + 1) {
    const longlong2 at = corner(t);
    const std::int64_t r0 = at.x, c0 = at.y;
    wait_async_copies<stages - 1>();  // tile t's group has landed
    float v[runs_per_thread][run];
#pragma unroll
    for (int u = 0; u < runs_per_thread; ++u) {
      const std::int64_t r = row_of(at, u), c = column_of(at, u);
      if (whole(r, c)) {
        const Run p = staging[stage][u][threadIdx.x];
#pragma unroll
        for (int e = 0; e < run; ++e) v[u][e] = to_compute<float>(p.v[e]);
      } else {
        load_run_or_zeros(j.x, j.x_rows, j.x_cols, r, c, false, v[u]);
      }
    }
    fetch(t + std::int64_t{stages} * gridDim.x, stage);  // the stage is read: refill it
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
    if constexpr (SumColumns) sum_warp_columns(v, warp_sums);
    // (the same for every thread of the block)
    if (!SumColumns && j.transposed == nullptr) continue;
    __syncthreads();
    if (j.transposed) {
      store_transposed(block, r0, c0, j.cols, padded_rows, j.transposed, j.transposed_ld, j.transposed_aligned);
    }
    if (SumColumns && threadIdx.x < tile && r0 < j.x_rows && c0 + threadIdx.x < j.x_cols) {
      float total = warp_sums[0][threadIdx.x];
      for (int w = 1; w < warps; ++w) total += warp_sums[w][threadIdx.x];
      j.column_partials[r0 / tile * j.x_cols + c0 + threadIdx.x] = total;
    }
    __syncthreads();  // the tile and the sums are read before the next tile's overwrite them
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
// the rows and columns), the tile through shared memory, its columns' runs written as 8 bytes of the transpose. The
// next tile's runs are loaded before this tile's transpose is written (its loads in flight while the stores go).
struct TransposeJob {
  const std::uint8_t* codes;
  std::int64_t rows, cols, ld;
  std::uint8_t* transposed;
  std::int64_t transposed_ld;
  bool aligned, transposed_aligned;
};
// Tile t's runs (tiles_across tiles to a row of tiles).
__device__ __forceinline__ void load_code_runs(const TransposeJob& j, std::int64_t t, std::int64_t tiles_across,
                                               uint2 (&q)[runs_per_thread]) {
  const std::int64_t r0 = t / tiles_across * tile, c0 = t % tiles_across * tile;
#pragma unroll
  for (int u = 0; u < runs_per_thread; ++u) {
    const int k = threadIdx.x + u * quantize_threads, i = k / (tile / run), c = k % (tile / run) * run;
    const std::int64_t r = r0 + i, col = c0 + c;
    q[u] = make_uint2(0, 0);
    if (r < j.rows && j.aligned && col + run <= j.cols) {
      q[u] = *reinterpret_cast<const uint2*>(j.codes + r * j.ld + col);
    } else if (r < j.rows) {
      for (int e = 0; e < run && col + e < j.cols; ++e) {
        const std::uint32_t code = std::uint32_t{j.codes[r * j.ld + col + e]} << (8 * (e % 4));
        (e < 4 ? q[u].x : q[u].y) |= code;
      }
    }
  }
}
__global__ void __launch_bounds__(quantize_threads) transpose_codes_kernel(const TransposeJob j) {
  __shared__ alignas(16) std::uint8_t block[tile][tile + 4];
  wait_for_prior_kernels();
  const std::int64_t tiles_across = (j.cols + tile - 1) / tile;
  const std::int64_t tiles = tiles_across * ((j.transposed_ld + tile - 1) / tile);
  uint2 q[runs_per_thread];
  if (blockIdx.x < tiles) load_code_runs(j, blockIdx.x, tiles_across, q);
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::int64_t r0 = t / tiles_across * tile, c0 = t % tiles_across * tile;
#pragma unroll
    for (int u = 0; u < runs_per_thread; ++u) {
      const int k = threadIdx.x + u * quantize_threads;
      store_tile_run(block, k / (tile / run), k % (tile / run) * run, q[u]);
    }
    __syncthreads();
    if (t + gridDim.x < tiles) load_code_runs(j, t + gridDim.x, tiles_across, q);
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
  const std::int64_t tiles = ((padded_rows + tile - 1) / tile) * ((cols + tile - 1) / tile);
  check(tiles + band_tiles * ((cols + tile - 1) / tile) < (std::int64_t{1} << 32), "fp8_quantize", "codes [",
        padded_rows, ", ", cols, "] have more tiles of ", tile, " x ", tile, " than the kernel counts in 32 bits");
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
                     .column_partials = q.column_partials,
                     .x_aligned = q.cols % run == 0 && at(q.x, 16),
                     .codes_aligned = cols % run == 0 && at(q.codes, 8),
                     .transposed_aligned = transposed_ld % run == 0 && at(q.transposed, 8)};
    const auto run_kernel = [&](auto kernel) {
      const std::int64_t blocks = launch.resident_blocks(kernel, tiles, quantize_threads, 0);
      launch_overlapped(launch, kernel, static_cast<int>(blocks), quantize_threads, 0, job);
    };
    const auto run_format = [&](auto format) {
      if (q.column_partials) {
        run_kernel(quantize_kernel<S, decltype(format)::value, true>);
      } else {
        run_kernel(quantize_kernel<S, decltype(format)::value, false>);
      }
    };
    if (f == fp8::Format::e4m3) {
      run_format(std::integral_constant<fp8::Format, fp8::Format::e4m3>{});
    } else {
      run_format(std::integral_constant<fp8::Format, fp8::Format::e5m2>{});
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
  // (the grid the SMs hold at once: each block walks several tiles, its next tile's loads in flight)
  const std::int64_t blocks = launch.resident_blocks(transpose_codes_kernel, tiles, quantize_threads, 0);
  launch_overlapped(launch, transpose_codes_kernel, static_cast<int>(blocks), quantize_threads, 0, job);
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

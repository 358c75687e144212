// Block scaling's quantization (see fp8_block_quantize.hpp). One thread block per 128 × 128 tile of x, read once:
// each thread loads the same 8 columns of 8 rows (every load in flight at once) and keeps them in registers; the
// amaxes of the tile's rows and columns (the 1×128 tiles of the codes and of their transpose), or of the whole tile
// (a weight's block), gather by warp shuffles and one shared row per warp; then the thread converts its values,
// writing the codes in runs of 8 and the transposed codes through shared memory as cuda/fp8_quantize.cu does. Maxima
// of f32 bit patterns, so no order of the threads changes them.
#include "tapegrad/cuda/fp8_block_quantize.hpp"

#include <algorithm>
#include <cstdint>

#include "tapegrad/cuda/fp8_codes.cuh"
#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::cuda {

namespace {

constexpr int tile = fp8::block_tile, run = 8, threads = 256;
constexpr int runs_across = tile / run;             // a tile row's runs
constexpr int rows_per_step = threads / runs_across;  // rows the block's threads cover at once
constexpr fp8::Format e4m3 = fp8::Format::e4m3;

struct Layout {
  const void* x;
  std::int64_t rows, x_cols;  // x's (zeros past them)
  std::int64_t cols;          // the codes' (and the transpose's rows)
  std::int64_t padded_rows;  // of the transpose: transposed_ld
  std::int64_t tiled_rows;   // the rows the tiles cover: the codes' and the transpose's
  bool blocks;
  std::uint8_t* codes;
  std::int64_t codes_rows;
  float* scales;
  std::int64_t scales_ld;  // floats between the scales of consecutive tiles along K (rows of scales)
  std::uint8_t* transposed;
  std::int64_t transposed_ld;
  float* transposed_scales;
  std::int64_t transposed_scales_ld;
  bool x_aligned, codes_aligned, transposed_aligned;  // as in cuda/fp8_quantize.cu
};

constexpr int warps = threads / 32;
constexpr int runs_per_thread = tile / rows_per_step;  // the rows a thread converts, rows_per_step apart

template <class S> __global__ void __launch_bounds__(threads, 2) block_quantize_kernel(const Layout l) {
  static_assert(runs_across == 16 && rows_per_step == 2 * warps, "a warp holds two rows of runs, its halves");
  __shared__ unsigned int row_amax[tile], warp_column_amax[warps][tile];
  __shared__ float row_scale[tile], column_scale[tile];
  __shared__ alignas(16) std::uint8_t block[tile][tile + 4];
  wait_for_prior_kernels();
  const S* x = static_cast<const S*>(l.x);
  const std::int64_t tiles_across = (l.cols + tile - 1) / tile;
  const std::int64_t tiles_down = (l.tiled_rows + tile - 1) / tile, tiles = tiles_across * tiles_down;
  const int j0 = threadIdx.x % runs_across * run, i_first = threadIdx.x / runs_across, lane = threadIdx.x % 32;
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::int64_t tile_row = t / tiles_across, tile_col = t % tiles_across;
    const std::int64_t r0 = tile_row * tile, c0 = tile_col * tile;
    Pack<S, run> v[runs_per_thread];  // (as stored: f32 values would take twice the registers of 16-bit ones)
#pragma unroll
    for (int k = 0; k < runs_per_thread; ++k) {
      load_pack_or_zeros(x, l.rows, l.x_cols, r0 + i_first + k * rows_per_step, c0 + j0, l.x_aligned, v[k]);
    }
    // Rows: the 16 lanes of a half warp hold a row's runs. Columns: the two halves hold the same columns, the warps
    // their rows of them.
    unsigned int columns[run] = {};
#pragma unroll
    for (int k = 0; k < runs_per_thread; ++k) {
      unsigned int m = 0;
#pragma unroll
      for (int j = 0; j < run; ++j) {
        const unsigned int bits = abs_bits(v[k].v[j]);
        m = max(m, bits);
        columns[j] = max(columns[j], bits);
      }
      for (int offset = runs_across / 2; offset > 0; offset /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, offset));
      if (lane % runs_across == 0) row_amax[i_first + k * rows_per_step] = m;
    }
#pragma unroll
    for (int j = 0; j < run; ++j) {
      columns[j] = max(columns[j], __shfl_xor_sync(0xffffffffu, columns[j], runs_across));
      if (lane < runs_across) warp_column_amax[threadIdx.x / 32][j0 + j] = columns[j];
    }
    __syncthreads();
    if (l.blocks) {  // one scale for the whole tile: warp 0 takes the maximum of the rows'
      if (threadIdx.x < 32) {
        unsigned int m = 0;
        for (int i = threadIdx.x; i < tile; i += 32) m = max(m, row_amax[i]);
        m = __reduce_max_sync(0xffffffffu, m);
        const TileScales s = tile_scales(m);
        if (threadIdx.x == 0) {
          row_scale[0] = s.scale;
          if (l.scales && r0 < l.codes_rows) l.scales[tile_row * l.scales_ld + tile_col] = s.inverse;
          if (l.transposed_scales && r0 < l.padded_rows) {
            l.transposed_scales[tile_col * l.transposed_scales_ld + tile_row] = s.inverse;
          }
        }
        // The scales' rows are padded to 4 entries: ones past the last tile of a row.
        if (tile_col == tiles_across - 1 && l.scales && r0 < l.codes_rows &&
            tile_col + 1 + threadIdx.x < l.scales_ld) {
          l.scales[tile_row * l.scales_ld + tile_col + 1 + threadIdx.x] = 1.0f;
        }
        const std::int64_t transposed_tiles = (l.padded_rows + tile - 1) / tile;
        if (tile_row == transposed_tiles - 1 && l.transposed_scales &&
            tile_row + 1 + threadIdx.x < l.transposed_scales_ld) {
          l.transposed_scales[tile_col * l.transposed_scales_ld + tile_row + 1 + threadIdx.x] = 1.0f;
        }
      }
    } else if (threadIdx.x < tile) {  // a scale per row of the tile (for the codes) and per column (the transpose)
      const int k = threadIdx.x;
      unsigned int column = 0;
      for (int w = 0; w < warps; ++w) column = max(column, warp_column_amax[w][k]);
      const TileScales rs = tile_scales(row_amax[k]), cs = tile_scales(column);
      row_scale[k] = rs.scale;
      column_scale[k] = cs.scale;
      // (rows past x's are padding: scale 1, as the scales' padding to a multiple of 4 asks)
      if (l.scales && r0 + k < l.scales_ld) l.scales[tile_col * l.scales_ld + r0 + k] = rs.inverse;
      if (l.transposed_scales && r0 < l.padded_rows && c0 + k < l.transposed_scales_ld) {
        l.transposed_scales[tile_row * l.transposed_scales_ld + c0 + k] = cs.inverse;
      }
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < runs_per_thread; ++k) {
      const int i = i_first + k * rows_per_step;
      const float scale = l.blocks ? row_scale[0] : row_scale[i];
      float values[run];
#pragma unroll
      for (int j = 0; j < run; ++j) values[j] = to_compute<float>(v[k].v[j]);
      const uint2 q = to_fp8_run<e4m3>(values, scale);
      if (l.transposed) {  // (the transpose's tiles scale by column: their own codes but with one tile scale)
        uint2 t = q;
        if (!l.blocks) {
          float column_scaled[run];
#pragma unroll
          for (int j = 0; j < run; ++j) column_scaled[j] = values[j] * column_scale[j0 + j];
          t = to_fp8_run<e4m3>(column_scaled, 1.0f);
        }
        store_tile_run(block, i, j0, t);
      }
      if (l.codes) {
        const bool whole = l.codes_aligned && r0 + i < l.codes_rows && c0 + j0 + run <= l.cols;
        store_run(l.codes, l.codes_rows, l.cols, r0 + i, c0 + j0, whole, q);
      }
    }
    if (l.transposed) {  // (the same for every thread of the block)
      __syncthreads();
      store_transposed(block, r0, c0, l.cols, l.padded_rows, l.transposed, l.transposed_ld, l.transposed_aligned);
    }
    __syncthreads();  // the tile's shared values are read before the next tile's overwrite them
  }
}

}  // namespace

void fp8_block_quantize(const Fp8BlockQuantize& q, int device) {
  constexpr const char* op = "fp8_block_quantize";
  check(q.rows >= 0 && q.cols >= 0, op, "negative size [", q.rows, ", ", q.cols, "]");
  check(q.scaling == Fp8Scaling::tiles_1x128 || q.scaling == Fp8Scaling::blocks_128x128, op,
        "quantizes in 1x128 tiles or 128x128 blocks, not one scale per tensor");
  check(q.dtype == DType::f32 || q.dtype == DType::bf16 || q.dtype == DType::f16, op,
        "quantizes f32, bf16 or f16, not ", dtype_name(q.dtype));
  check(!q.codes == !q.scales && !q.transposed == !q.transposed_scales, op,
        "each layout asked for needs its codes and its scales");
  const std::int64_t transposed_ld = q.transposed_ld == 0 ? q.rows : q.transposed_ld;
  check(!q.transposed || transposed_ld >= q.rows, op, "the transposed codes' rows (", transposed_ld,
        ") are shorter than x's ", q.rows, " rows");
  const std::int64_t codes_rows = q.codes_rows == 0 ? q.rows : q.codes_rows;
  check(codes_rows >= q.rows, op, "the codes' rows (", codes_rows, ") are fewer than x's ", q.rows);
  const std::int64_t cols = q.codes_cols == 0 ? q.cols : q.codes_cols;
  check(cols >= q.cols, op, "the codes' columns (", cols, ") are fewer than x's ", q.cols);
  const std::int64_t tiled_rows = std::max(q.codes ? codes_rows : 0, q.transposed ? transposed_ld : 0);
  if (tiled_rows == 0 || cols == 0) return;
  const bool blocks = q.scaling == Fp8Scaling::blocks_128x128;
  const auto at = [](const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; };
  const std::int64_t tiles_across = (cols + tile - 1) / tile, tiles_down = (tiled_rows + tile - 1) / tile;
  const Layout layout{.x = q.x,
                      .rows = q.rows,
                      .x_cols = q.cols,
                      .cols = cols,
                      .padded_rows = transposed_ld,
                      .tiled_rows = tiled_rows,
                      .blocks = blocks,
                      .codes = static_cast<std::uint8_t*>(q.codes),
                      .codes_rows = codes_rows,
                      .scales = q.scales,
                      .scales_ld = fp8_scale_shape(q.scaling, codes_rows, cols).ld,
                      .transposed = static_cast<std::uint8_t*>(q.transposed),
                      .transposed_ld = transposed_ld,
                      .transposed_scales = q.transposed_scales,
                      .transposed_scales_ld = fp8_scale_shape(q.scaling, cols, transposed_ld).ld,
                      .x_aligned = q.cols % run == 0 && at(q.x, 16),
                      .codes_aligned = cols % run == 0 && at(q.codes, 8),
                      .transposed_aligned = transposed_ld % run == 0 && at(q.transposed, 8)};
  const Launch launch(device);
  dispatch_float(q.dtype, op, [&](auto tag) {
    using S = decltype(tag);
    const int blocks = launch.blocks_for(tiles_across * tiles_down * threads, threads);
    launch_overlapped(launch, block_quantize_kernel<S>, blocks, threads, 0, layout);
  });
}

}  // namespace tapegrad::cuda

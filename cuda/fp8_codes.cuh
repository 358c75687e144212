// FP8 on the device, for the kernels that write fp8 codes (cuda/fp8_*quantize.cu, cuda/mlp_activation*.cu): a value's
// code, a block's amax, a run's loads and a tile's transposed stores. Internal to cuda/.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "tapegrad/tensor/core/fp8.hpp"
#include "tapegrad/tensor/gpu/detail/launch.cuh"

namespace tapegrad::cuda {

// The hardware's conversion (round to nearest even, saturating to the largest finite value): tensor/core/fp8.hpp's
// from_double of the same f32, the CPU's; a NaN gives nan_code as there.
template <fp8::Format F> __device__ __forceinline__ std::uint8_t to_fp8(float v) {
  if (v != v) return fp8::nan_code;
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, F == fp8::Format::e4m3 ? __NV_E4M3 : __NV_E5M2);
}

// The codes of 8 values (v[e] · scale) as to_fp8 makes each, element e in byte e: four of the hardware's paired
// conversions (a NaN pair falls back to to_fp8's, for its nan_code).
template <fp8::Format F> __device__ __forceinline__ uint2 to_fp8_run(const float (&v)[8], float scale) {
  std::uint32_t pairs[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const float lo = v[2 * p] * scale, hi = v[2 * p + 1] * scale;
    pairs[p] = lo != lo || hi != hi ? to_fp8<F>(lo) | std::uint32_t{to_fp8<F>(hi)} << 8
                                    : __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE,
                                                               F == fp8::Format::e4m3 ? __NV_E4M3 : __NV_E5M2);
  }
  return make_uint2(__byte_perm(pairs[0], pairs[1], 0x5410), __byte_perm(pairs[2], pairs[3], 0x5410));
}

// The bits of |v| as f32: they order as the magnitudes do (NaN above infinity), so their maximum is an amax that no
// order of the threads changes.
template <class S> __device__ __forceinline__ unsigned int abs_bits(S v) {
  return __float_as_uint(fabsf(to_compute<float>(v)));
}

// Block scaling's scale for a tile whose amax has the f32 bits amax_bits (tensor/core/fp8.hpp's block_scale, in e4m3),
// and the inverse a product multiplies its codes by; a tile holding an infinity or a NaN gets scale 1 and inverse NaN.
struct TileScales {
  float scale, inverse;
};
__device__ __forceinline__ TileScales tile_scales(unsigned int amax_bits) {
  const float amax = __uint_as_float(amax_bits);
  if (!isfinite(amax)) return {1.0f, __int_as_float(0x7fc00000)};
  const float scale = fp8::block_scale(amax, fp8::max_value<fp8::Format::e4m3>());
  return {scale, 1.0f / scale};
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

// Elements [c, c + R) of row r of x [rows, cols] as stored, zero past the matrix's edges; one run of 16-byte loads
// where `aligned` (cols a multiple of R, x 16-byte aligned) and the run lies whole inside. Returns whether it did.
// (Unconverted: a kernel that holds runs until it has read the rest of its tile keeps 16-bit x in half the registers.)
template <int R, class S>
__device__ __forceinline__ bool load_pack_or_zeros(const S* x, std::int64_t rows, std::int64_t cols, std::int64_t r,
                                                   std::int64_t c, bool aligned, Pack<S, R>& p) {
  const bool whole = aligned && r < rows && c + R <= cols;
  if (whole) {
    p = *reinterpret_cast<const Pack<S, R>*>(x + r * cols + c);
  } else {
    for (int j = 0; j < R; ++j) p.v[j] = r < rows && c + j < cols ? x[r * cols + c + j] : from_compute<S>(0.0f);
  }
  return whole;
}

// load_pack_or_zeros's elements as f32.
template <int R, class S>
__device__ __forceinline__ bool load_run_or_zeros(const S* x, std::int64_t rows, std::int64_t cols, std::int64_t r,
                                                  std::int64_t c, bool aligned, float (&v)[R]) {
  Pack<S, R> p;
  const bool whole = load_pack_or_zeros(x, rows, cols, r, c, aligned, p);
  for (int j = 0; j < R; ++j) v[j] = to_compute<float>(p.v[j]);
  return whole;
}

// Code e of a run of 8 (element e in byte e). (Shifts, not a byte pointer into q: taking q's address would put it in
// local memory, stored there on every path.)
__device__ __forceinline__ std::uint8_t code_of(uint2 q, int e) {
  return static_cast<std::uint8_t>((e < 4 ? q.x : q.y) >> (8 * (e % 4)));
}

// The codes q of elements [c, c + 8) of row r (element e in byte e) into codes [rows, cols], none past its edges: one
// 8-byte store where `whole` (the run lies inside, cols a multiple of 8 and codes 8-byte aligned).
__device__ __forceinline__ void store_run(std::uint8_t* codes, std::int64_t rows, std::int64_t cols, std::int64_t r,
                                          std::int64_t c, bool whole, uint2 q) {
  if (whole) {
    *reinterpret_cast<uint2*>(codes + r * cols + c) = q;
  } else if (r < rows) {
    for (int j = 0; j < 8 && c + j < cols; ++j) codes[r * cols + c + j] = code_of(q, j);
  }
}

// Columns j .. j + 4 of a tile of codes, rows i0 .. i0 + 8: out[c] holds column j + c's 8 codes, row i0's in its
// lowest byte. The rows' 4-byte words (j a multiple of 4, the tile's rows 4-byte aligned) go through two 4×4 byte
// transposes, 8 loads and 16 byte permutes where the codes one at a time take 32 loads.
template <int Tile, int Ld>
__device__ __forceinline__ void tile_columns(const std::uint8_t (&block)[Tile][Ld], int j, int i0, uint2 (&out)[4]) {
  static_assert(Ld % 4 == 0);
  std::uint32_t w[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i] = *reinterpret_cast<const std::uint32_t*>(&block[i0 + i][j]);
  std::uint32_t half[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const std::uint32_t* r = w + 4 * h;
    // (bytes 0, 1 of rows 0, 1 interleaved; bytes 2, 3; the same of rows 2, 3; then the columns from them)
    const std::uint32_t a = __byte_perm(r[0], r[1], 0x5140), b = __byte_perm(r[0], r[1], 0x7362);
    const std::uint32_t c = __byte_perm(r[2], r[3], 0x5140), d = __byte_perm(r[2], r[3], 0x7362);
    half[h][0] = __byte_perm(a, c, 0x5410);
    half[h][1] = __byte_perm(a, c, 0x7632);
    half[h][2] = __byte_perm(b, d, 0x5410);
    half[h][3] = __byte_perm(b, d, 0x7632);
  }
#pragma unroll
  for (int c = 0; c < 4; ++c) out[c] = make_uint2(half[0][c], half[1][c]);
}

// A run of 8 codes (element e in byte e) into a tile's row at column j (a multiple of 4): two 4-byte stores.
template <int Tile, int Ld>
__device__ __forceinline__ void store_tile_run(std::uint8_t (&block)[Tile][Ld], int i, int j, uint2 q) {
  static_assert(Ld % 4 == 0);
  reinterpret_cast<std::uint32_t*>(&block[i][j])[0] = q.x;
  reinterpret_cast<std::uint32_t*>(&block[i][j])[1] = q.y;
}

// The transpose of a tile of codes, block[i][j] the code of x's element (r0 + i, c0 + j), into transposed [cols, ld]
// up to row padded_rows: each thread of the block takes 4 columns of 8 rows (tile_columns) and writes each column's
// run as one 8-byte store where `aligned` (ld a multiple of 8, transposed 8-byte aligned). Called by every thread of
// the block, after the tile is complete in shared memory. A warp takes 8 neighbouring 4-byte columns of 4 neighbouring
// runs of rows: with rows an odd number of 4-byte words apart (Ld), its 32 loads of a row each hit a bank of their own.
template <int Tile, int Ld>
__device__ __forceinline__ void store_transposed(const std::uint8_t (&block)[Tile][Ld], std::int64_t r0,
                                                 std::int64_t c0, std::int64_t cols, std::int64_t padded_rows,
                                                 std::uint8_t* transposed, std::int64_t ld, bool aligned) {
  constexpr int run = 8, runs_down = Tile / run, word_columns = Tile / 4;
  static_assert(word_columns % 8 == 0 && Ld % 8 == 4, "a warp's 8 word columns, rows an odd number of words apart");
  const int threads = blockDim.x * blockDim.y, thread = threadIdx.y * blockDim.x + threadIdx.x;
  for (int k = thread; k < word_columns * runs_down; k += threads) {
    const int lane = k % 32, warp = k / 32;
    const int j = (lane % 8 + warp % (word_columns / 8) * 8) * 4;  // columns j .. j + 4 of the tile
    const int i0 = (lane / 8 + warp / (word_columns / 8) * 4) * run;  // rows i0 .. i0 + 8
    const std::int64_t r = r0 + i0;
    if (c0 + j >= cols || r >= padded_rows) continue;
    uint2 q[4];
    tile_columns(block, j, i0, q);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (c0 + j + c >= cols) break;
      std::uint8_t* at = transposed + (c0 + j + c) * ld + r;
      if (aligned && r + run <= padded_rows) {
        *reinterpret_cast<uint2*>(at) = q[c];
      } else {
        for (int i = 0; i < run && r + i < padded_rows; ++i) at[i] = code_of(q[c], i);
      }
    }
  }
}

}  // namespace tapegrad::cuda

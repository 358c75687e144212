// The activation's backward with fp8 outputs (interface: cuda/mlp_activation.hpp): where dz's and a's scales are
// known before the kernel (delayed scaling's; a's made by the forward), it writes their codes (and transposed codes)
// itself where the plain backward writes dz and a in the storage type and a quantization pass reads them back
// (fp8_quantize's traffic, saved); current scaling's dz, whose scale comes from its amax, it writes as values with
// that amax (no pass over dz to find it).
//
// Block (t, c) takes the t-th tile of 64 columns over chunk c's rows (whole tiles of 64 rows, a function of the
// shape only), tile after tile: each thread converts runs of 8 elements of a row (16-byte loads of z's halves and
// da), writes dz's codes of its run (converted in pairs), and leaves the tile's codes in shared memory as 4-byte
// words, from which runs of 8 codes down 4 columns at a time are written as 8 bytes of each transpose (fp8_codes.cuh's
// tile_columns, as fp8_quantize does). dbias: each thread adds its run's columns over its rows in row order; the block
// adds its threads' sums in a fixed order into the chunk's partial row.
#include <algorithm>
#include <cstdint>

#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/cuda/fp8_codes.cuh"
#include "tapegrad/cuda/mlp_activation.hpp"
#include "tapegrad/cuda/mlp_activation_forms.cuh"
#include "tapegrad/cuda/partial_sums.hpp"
#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::cuda {

namespace {

using namespace activation_forms;

constexpr int tile = 64;
constexpr int run = 8;
constexpr int threads = 256;
constexpr int runs_across = tile / run;                // 8 runs make a tile's row
constexpr int rows_per_pass = threads / runs_across;  // the tile's rows the block converts at once: 32
// About 2048 blocks over the problem, as the plain backward's chunks.
constexpr std::int64_t target_blocks = 2048;

// The rows the kernel covers: rows rounded up to whole 16-byte rows of codes, the transposes' rows (zero codes past
// `rows`).
std::int64_t covered_rows(std::int64_t rows) {
  return (rows + fp8_row_alignment - 1) / fp8_row_alignment * fp8_row_alignment;
}

// Rows per chunk, whole tiles; depends on the covered rows and F only.
std::int64_t chunk_rows(std::int64_t covered, std::int64_t F) {
  const std::int64_t tiles_across = (F + tile - 1) / tile, tiles_down = (covered + tile - 1) / tile;
  const std::int64_t chunks = std::clamp<std::int64_t>((target_blocks + tiles_across - 1) / tiles_across, 1,
                                                       std::max<std::int64_t>(tiles_down, 1));
  return (tiles_down + chunks - 1) / chunks * tile;
}
std::int64_t chunks(std::int64_t covered, std::int64_t F) {
  return covered == 0 ? 0 : (covered + chunk_rows(covered, F) - 1) / chunk_rows(covered, F);
}

template <class S> struct Buffers {
  const S* z;
  const S* da;
  const float* dz_scale;
  std::uint8_t* dz_codes;
  std::uint8_t* dz_transposed;
  S* dz;
  unsigned int* dz_amax_bits;
  const float* a_scale;
  std::uint8_t* a_transposed;
  std::int64_t transposed_ld;
  compute_of<S>* partials;
};

// x[0 .. run) = v, in 16-byte stores (x 16-byte aligned).
template <class S> __device__ __forceinline__ void store_values(S* x, const S (&v)[run]) {
  static_assert(sizeof(S) * run % 16 == 0);
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(S)) * run / 16; ++k) {
    reinterpret_cast<uint4*>(x)[k] = reinterpret_cast<const uint4*>(v)[k];
  }
}

using CodeTile = std::uint8_t[tile][tile + 4];

// The tile's columns j .. j + 4, rows i0 .. i0 + run, of `codes` to rows `at`, `at` + ld, ... of a transpose (8 bytes
// each).
__device__ __forceinline__ void write_columns(const CodeTile& codes, int j, int i0, std::uint8_t* at,
                                              std::int64_t ld) {
  uint2 q[4];
  tile_columns(codes, j, i0, q);
#pragma unroll
  for (int c = 0; c < 4; ++c) *reinterpret_cast<uint2*>(at + c * ld) = q[c];
}

template <class S, Form Fixed, fp8::Format G>
__global__ void __launch_bounds__(threads)
    backward_codes_kernel(const ActivationForm act, const Buffers<S> b, std::int64_t rows, std::int64_t covered,
                          std::int64_t F, std::int64_t chunk_rows) {
  using C = compute_of<S>;
  __shared__ alignas(16) CodeTile a_tile, dz0_tile, dz1_tile;
  __shared__ C column_sums[rows_per_pass][tile];
  wait_for_prior_kernels();
  const int width = width_of<Fixed>(act);
  const std::int64_t c0 = blockIdx.x * std::int64_t{tile};
  const std::int64_t first = blockIdx.y * chunk_rows;
  const std::int64_t last = first + chunk_rows < covered ? first + chunk_rows : covered;
  const int j0 = threadIdx.x % runs_across * run, i_first = threadIdx.x / runs_across;
  const std::int64_t c = c0 + j0;
  const bool in_columns = c < F;  // F is a multiple of 8: a run is whole or past F
  const float dz_scale = b.dz_scale ? *b.dz_scale : 0.0f, a_scale = b.a_transposed ? *b.a_scale : 0.0f;
  const bool dz_quantized = b.dz_codes || b.dz_transposed;
  unsigned int amax = 0;
  C sum0[run] = {}, sum1[run] = {};
  for (std::int64_t r0 = first; r0 < last; r0 += tile) {
    for (int i = i_first; i < tile; i += rows_per_pass) {
      const std::int64_t r = r0 + i;
      uint2 qa{}, q0{}, q1{};  // zero codes past the rows
      if (in_columns && r < rows) {
        float z0[run], z1[run], da[run], a[run], dz0_values[run], dz1_values[run];
        alignas(16) S dz0[run], dz1[run];
        load_run(b.z + r * width * F + c, z0);
        if (width == 2) load_run(b.z + r * width * F + F + c, z1);
        load_run(b.da + r * F + c, da);
#pragma unroll
        for (int v = 0; v < run; ++v) {
          const BackwardElement<S> e = backward_element<Fixed, S>(act, width, C(z0[v]), width == 2 ? C(z1[v]) : C(0),
                                                                  C(da[v]));
          dz0[v] = e.dz0;
          dz1[v] = e.dz1;
          sum0[v] += to_compute<C>(e.dz0);
          amax = max(amax, abs_bits(e.dz0));
          dz0_values[v] = to_compute<float>(e.dz0);
          if (width == 2) {
            sum1[v] += to_compute<C>(e.dz1);
            amax = max(amax, abs_bits(e.dz1));
            dz1_values[v] = to_compute<float>(e.dz1);
          }
          a[v] = to_compute<float>(e.a);
        }
        if (dz_quantized) {  // (the same for every thread of the block)
          q0 = to_fp8_run<G>(dz0_values, dz_scale);
          if (width == 2) q1 = to_fp8_run<G>(dz1_values, dz_scale);
        }
        if (b.a_transposed) qa = to_fp8_run<fp8::Format::e4m3>(a, a_scale);
        if (b.dz) {  // (z's run was read above: dz may be written over it)
          store_values(b.dz + r * width * F + c, dz0);
          if (width == 2) store_values(b.dz + r * width * F + F + c, dz1);
        }
        if (b.dz_codes) {
          std::uint8_t* row = b.dz_codes + r * width * F + c;
          *reinterpret_cast<uint2*>(row) = q0;
          if (width == 2) *reinterpret_cast<uint2*>(row + F) = q1;
        }
      }
      if (b.a_transposed) store_tile_run(a_tile, i, j0, qa);
      if (b.dz_transposed) {
        store_tile_run(dz0_tile, i, j0, q0);
        if (width == 2) store_tile_run(dz1_tile, i, j0, q1);
      }
    }
    if (!b.dz_transposed && !b.a_transposed) continue;  // (the same for every thread of the block)
    __syncthreads();
    // Each transposed tile in tasks of 4 columns by 8 rows, a's then dz's halves; a thread takes one tile's task.
    constexpr int runs_down = tile / run, tasks = tile / 4 * runs_down;
    for (int k = threadIdx.x; k < 3 * tasks; k += threads) {
      const int part = k / tasks, j = k % tasks / runs_down * 4, i0 = k % runs_down * run;
      const std::int64_t cj = c0 + j, r = r0 + i0;
      // (F and `last` are multiples of 8, j and r of 4 and 8: the 4 columns and 8 rows are whole or past them)
      if (cj >= F || r >= last) continue;
      if (part == 0 && b.a_transposed) {
        write_columns(a_tile, j, i0, b.a_transposed + cj * b.transposed_ld + r, b.transposed_ld);
      } else if (part > 0 && part <= width && b.dz_transposed) {
        write_columns(part == 1 ? dz0_tile : dz1_tile, j, i0,
                      b.dz_transposed + ((part - 1) * F + cj) * b.transposed_ld + r, b.transposed_ld);
      }
    }
    __syncthreads();  // the tiles are read before the next ones overwrite them
  }
  if (b.dz_amax_bits) merge_amax(amax, b.dz_amax_bits);  // (the same for every thread of the block)
  if (!b.partials) return;
  // The chunk's partial row: the 32 threads of a column group's sums, added in thread order.
  for (int half = 0; half < width; ++half) {
#pragma unroll
    for (int v = 0; v < run; ++v) column_sums[i_first][j0 + v] = half == 0 ? sum0[v] : sum1[v];
    __syncthreads();
    if (threadIdx.x < tile && c0 + threadIdx.x < F) {
      C total = column_sums[0][threadIdx.x];
      for (int i = 1; i < rows_per_pass; ++i) total += column_sums[i][threadIdx.x];
      b.partials[blockIdx.y * width * F + half * F + c0 + threadIdx.x] = total;
    }
    __syncthreads();
  }
}

}  // namespace

std::int64_t mlp_activation_codes_partials(std::int64_t rows, std::int64_t F, int width) {
  return chunks(covered_rows(rows), F) * width * F;
}

void mlp_activation_backward_codes(DType dtype, int device, const ActivationForm& act, const void* z, const void* da,
                                   const ActivationBackwardCodes& out, std::int64_t rows, std::int64_t F) {
  constexpr const char* op = "layernorm_mlp";
  check(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, op,
        "the activation's fp8 codes are made from f32, bf16 or f16, not ", dtype_name(dtype));
  check(out.dz_format == DType::f8e4m3 || out.dz_format == DType::f8e5m2, op, "dz's format must be fp8, got ",
        dtype_name(out.dz_format));
  const std::int64_t covered = covered_rows(rows);
  check(F % fp8_row_alignment == 0 && (!(out.dz_transposed || out.a_transposed) || out.transposed_ld >= covered), op,
        "the fused backward needs F (", F, ") in a multiple of ", fp8_row_alignment, " and the transposes' rows (",
        out.transposed_ld, ") at least ", rows, " rounded up to ", fp8_row_alignment);
  check(!out.dbias || out.partials, op, "the fused backward sums dbias from partials it is given");
  check((out.dz_scale || !(out.dz_codes || out.dz_transposed)) && (out.a_scale || !out.a_transposed), op,
        "the fused backward needs the scales of its codes");
  check(aligned_16(z) && aligned_16(da) && aligned_16(out.dz) && aligned_to(out.dz_codes, 8) &&
            aligned_to(out.dz_transposed, 8) && aligned_to(out.a_transposed, 8),
        op, "the fused backward reads and writes 16-byte runs: z, da and dz must be 16-byte aligned, the codes 8");
  const std::int64_t chunk_count = chunks(covered, F);  // (none for no rows: dbias sums to zeros)
  if (covered > 0 && F > 0) {
    const Launch launch(device);
    const dim3 grid(static_cast<unsigned>((F + tile - 1) / tile), static_cast<unsigned>(chunk_count));
    dispatch_float(dtype, op, [&](auto tag) {
      using S = decltype(tag);
      if constexpr (sizeof(S) <= 4) {
        const Buffers<S> b{static_cast<const S*>(z),
                           static_cast<const S*>(da),
                           out.dz_scale,
                           static_cast<std::uint8_t*>(out.dz_codes),
                           static_cast<std::uint8_t*>(out.dz_transposed),
                           static_cast<S*>(out.dz),
                           reinterpret_cast<unsigned int*>(out.dz_amax),
                           out.a_scale,
                           static_cast<std::uint8_t*>(out.a_transposed),
                           out.transposed_ld,
                           static_cast<compute_of<S>*>(out.partials)};
        const auto run_kernel = [&](auto kernel) {
          launch_overlapped(launch, kernel, grid, threads, 0, act, b, rows, covered, F, chunk_rows(covered, F));
        };
        const bool e4m3 = out.dz_format == DType::f8e4m3;
        const Form form = form_of(act);
        if (form == Form::gelu) {
          e4m3 ? run_kernel(backward_codes_kernel<S, Form::gelu, fp8::Format::e4m3>)
               : run_kernel(backward_codes_kernel<S, Form::gelu, fp8::Format::e5m2>);
        } else if (form == Form::swiglu) {
          e4m3 ? run_kernel(backward_codes_kernel<S, Form::swiglu, fp8::Format::e4m3>)
               : run_kernel(backward_codes_kernel<S, Form::swiglu, fp8::Format::e5m2>);
        } else {
          e4m3 ? run_kernel(backward_codes_kernel<S, Form::general, fp8::Format::e4m3>)
               : run_kernel(backward_codes_kernel<S, Form::general, fp8::Format::e5m2>);
        }
      }
    });
  }
  if (out.dbias) {
    const DType sums = out.wide_dbias ? compute_dtype(dtype) : dtype;
    const PartialSums db1{out.partials, out.dbias};
    sum_partials(sums, {&db1, 1}, chunk_count, act.width() * F, device);
  }
}

}  // namespace tapegrad::cuda

// The activation step of layernorm_mlp (interface: cuda/mlp_activation.hpp).
//
// One kernel for both directions. The rows are cut into chunks (a function of the shape only); block (t, c) takes the
// t-th tile of threads · V columns over chunk c's rows, thread by thread the same V columns of every row (and of the
// gate half, for gated activations), read V at a time: 16 bytes where the rows allow, one element otherwise. Each
// thread has the loads of its next row in flight while it computes the current one. Backward, each thread adds its
// columns of dz (as rounded to the storage type) over its chunk's rows in row order and writes the chunk's partial
// row; sum_partials adds the partial rows in a fixed order: db1 is bitwise the same on every run and for either V.
#include "tapegrad/cuda/mlp_activation.hpp"

#include "tapegrad/cuda/fp8_codes.cuh"
#include "tapegrad/cuda/mlp_activation_forms.cuh"
#include "tapegrad/cuda/partial_sums.hpp"
#include "tapegrad/cuda/rows.cuh"

namespace tapegrad::cuda {

namespace {

using namespace activation_forms;

constexpr int threads = 256;
// Each chunk writes a partial row of f32 for db1 and sum_partials reads it back: at 16 rows or more that is at most
// 1/16 of the kernel's own traffic (4-row chunks at 4096 x 4096 wrote 1024 partial rows, and their sum took 16 µs).
constexpr int min_chunk_rows = 16;

// Rows a thread computes between loads, and as many more in flight: 1, with 4 blocks per SM at least (64 registers).
// Measured on the H200 (GELU backward, bf16, 8192 x 16384): 2 rows at 2 blocks per SM moved 2.6 TB/s, 1 row at 4
// blocks 3.8 TB/s: more warps hide the memory latency better than more loads per warp.
constexpr int rows_in_flight = 1;
constexpr int min_blocks_per_sm = 4;

// Rows per chunk: about 2048 blocks over the whole problem (tiles counted for 16-bit packs of 8), at least
// min_chunk_rows rows each. Depends on rows and F only.
std::int64_t chunk_rows(std::int64_t rows, std::int64_t F) {
  const std::int64_t tiles = std::max<std::int64_t>(1, (F + 8 * threads - 1) / (8 * threads));
  const std::int64_t chunks = std::min((2048 + tiles - 1) / tiles, (rows + min_chunk_rows - 1) / min_chunk_rows);
  return (rows + std::max<std::int64_t>(chunks, 1) - 1) / std::max<std::int64_t>(chunks, 1);
}
std::int64_t chunks(std::int64_t rows, std::int64_t F) {
  return rows == 0 ? 0 : (rows + chunk_rows(rows, F) - 1) / chunk_rows(rows, F);
}

template <class S> struct Buffers {
  const S* z;
  const S* da;               // backward only
  S* a;                      // forward (unless codes); backward where not null (may be da: its loads come first)
  S* dz;                     // backward only
  compute_of<S>* partials;   // backward; null: no bias gradient
  // Forward, where codes is not null: a's e4m3 codes in place of a, with the scale, or with block scaling's per 1×128
  // tile of a row (their inverses to tile_scales, [F / 128, rows]).
  std::uint8_t* codes = nullptr;
  const float* scale = nullptr;
  float* tile_scales = nullptr;
  unsigned int* amax_bits = nullptr;  // forward: a's amax (as rounded to S); null: none
};

// The loads of R rows of a thread's columns: z (both halves for gated activations) and, backward, da.
template <class S, int V, int R, bool Backward> struct RowLoads {
  Pack<S, V> z0[R], z1[R], d[R];

  __device__ __forceinline__ void load(const Buffers<S>& b, std::int64_t r0, std::int64_t last, std::int64_t F,
                                       std::int64_t col, int width) {
#pragma unroll
    for (int k = 0; k < R; ++k) {
      if (r0 + k >= last) break;
      const S* z = b.z + (r0 + k) * width * F + col;
      z0[k] = *reinterpret_cast<const Pack<S, V>*>(z);
      if (width == 2) z1[k] = *reinterpret_cast<const Pack<S, V>*>(z + F);
      if constexpr (Backward) d[k] = *reinterpret_cast<const Pack<S, V>*>(b.da + (r0 + k) * F + col);
    }
  }
};

// Block scaling: the scale of the 1×128 tile of row r that holds the thread's V columns at col, from the tile's amax
// over the 128 / V lanes that hold it (aligned groups of a warp: a block's columns start at multiples of 128), whose
// first writes the tile's inverse scale. Every lane of the group calls it for the same row.
template <class S, int V>
__device__ __forceinline__ float tile_scale_of(const Pack<S, V>& a, float* inverses, std::int64_t rows,
                                               std::int64_t r, std::int64_t col) {
  constexpr int lanes = fp8::block_tile / V;
  static_assert(lanes == 16 || lanes == 32, "a tile's lanes are half a warp or a warp");
  const unsigned lane = threadIdx.x % 32;
  const unsigned group = lanes == 32 ? 0xffffffffu : 0xffffu << (lane & 16u);
  unsigned int m = 0;
#pragma unroll
  for (int v = 0; v < V; ++v) m = max(m, abs_bits(a.v[v]));
  for (int offset = lanes / 2; offset > 0; offset /= 2) m = max(m, __shfl_xor_sync(group, m, offset));
  const TileScales s = tile_scales(m);
  if (lane % lanes == 0) inverses[col / fp8::block_tile * rows + r] = s.inverse;
  return s.scale;
}

// Each thread keeps the next R rows' loads in flight while it computes the current R (a register double buffer):
// loading, then computing, left the memory idle while a warp computed.
template <class S, int V, bool Backward, Form Fixed>
__global__ void __launch_bounds__(threads, min_blocks_per_sm)
    activation_kernel(const ActivationForm act, const Buffers<S> b, std::int64_t rows, std::int64_t F,
                      std::int64_t chunk_rows) {
  wait_for_prior_kernels();
  using C = compute_of<S>;
  const int width = width_of<Fixed>(act);
  const std::int64_t col = (blockIdx.x * std::int64_t{threads} + threadIdx.x) * V;
  // Threads past F take no rows (but join the block's amax).
  const std::int64_t first = blockIdx.y * chunk_rows;
  const std::int64_t last = col >= F ? first : (first + chunk_rows < rows ? first + chunk_rows : rows);
  const float scale = !Backward && b.codes && !b.tile_scales ? *b.scale : 0.0f;
  unsigned int amax = 0;
  constexpr int R = rows_in_flight;
  C sum0[V] = {}, sum1[V] = {};
  RowLoads<S, V, R, Backward> now, next;
  now.load(b, first, last, F, col, width);
  for (std::int64_t r0 = first; r0 < last; r0 += R) {
    if (r0 + R < last) next.load(b, r0 + R, last, F, col, width);
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const std::int64_t r = r0 + k;
      if (r >= last) break;
      Pack<S, V> a, dz0, dz1;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const C z0 = to_compute<C>(now.z0[k].v[v]), z1 = width == 2 ? to_compute<C>(now.z1[k].v[v]) : C(0);
        if constexpr (Backward) {
          const BackwardElement<S> e = backward_element<Fixed, S>(act, width, z0, z1, to_compute<C>(now.d[k].v[v]));
          a.v[v] = e.a;
          dz0.v[v] = e.dz0;
          dz1.v[v] = e.dz1;
          sum0[v] += to_compute<C>(e.dz0);
          if (width == 2) sum1[v] += to_compute<C>(e.dz1);
        } else {
          C value = function_of<Fixed, sizeof(S) == 2>(act, z0, static_cast<C*>(nullptr));
          if (width == 2) value *= gate_of<Fixed, C>(act, z1, nullptr);
          a.v[v] = from_compute<S>(value);
          if (b.amax_bits) amax = max(amax, abs_bits(a.v[v]));
        }
      }
      if (!Backward && b.codes) {
        float code_scale = scale;
        if constexpr (fp8::block_tile / V <= 32) {  // (packs of 16 bytes: the launcher refuses tiles without them)
          if (b.tile_scales) code_scale = tile_scale_of(a, b.tile_scales, rows, r, col);
        }
        Pack<std::uint8_t, V> codes;
#pragma unroll
        for (int v = 0; v < V; ++v) codes.v[v] = to_fp8<fp8::Format::e4m3>(to_compute<float>(a.v[v]) * code_scale);
        *reinterpret_cast<Pack<std::uint8_t, V>*>(b.codes + r * F + col) = codes;
      } else if (!Backward || b.a) {
        store_streaming(reinterpret_cast<Pack<S, V>*>(b.a + r * F + col), a);
      }
      if constexpr (Backward) {
        S* dz = b.dz + r * width * F + col;
        store_streaming(reinterpret_cast<Pack<S, V>*>(dz), dz0);
        if (width == 2) store_streaming(reinterpret_cast<Pack<S, V>*>(dz + F), dz1);
      }
    }
    now = next;
  }
  if constexpr (!Backward) {
    if (b.amax_bits) merge_amax(amax, b.amax_bits);  // (the same for every thread of the block)
  }
  if constexpr (Backward) {
    if (b.partials && col < F) {
      C* partial = b.partials + blockIdx.y * width * F + col;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        partial[v] = sum0[v];
        if (width == 2) partial[F + v] = sum1[v];
      }
    }
  }
}

template <class S, bool Backward>
void launch_activation(int device, const ActivationForm& act, const Buffers<S>& b, std::int64_t rows,
                       std::int64_t F) {
  if (rows * F == 0) return;
  Launch launch(device);
  constexpr int wide = rows::wide_pack<S>;
  const bool packs = rows::packs_fit<S>(F, {b.z, b.da, b.a, b.dz, b.codes});
  const std::int64_t per_block = std::int64_t{threads} * (packs ? wide : 1);
  const dim3 grid(static_cast<unsigned>((F + per_block - 1) / per_block), static_cast<unsigned>(chunks(rows, F)));
  const std::int64_t per_chunk = chunk_rows(rows, F);
  const auto run = [&](auto kernel) {
    launch_overlapped(launch, kernel, grid, threads, 0, act, b, rows, F, per_chunk);
  };
  if (!packs) run(activation_kernel<S, 1, Backward, Form::general>);
  else if (form_of(act) == Form::gelu) run(activation_kernel<S, wide, Backward, Form::gelu>);
  else if (form_of(act) == Form::swiglu) run(activation_kernel<S, wide, Backward, Form::swiglu>);
  else run(activation_kernel<S, wide, Backward, Form::general>);
}

}  // namespace

std::int64_t mlp_activation_partials(std::int64_t rows, std::int64_t F, int width) {
  return chunks(rows, F) * width * F;
}

void mlp_activation_forward(DType dtype, int device, const ActivationForm& act, const void* z, void* a,
                            std::int64_t rows, std::int64_t F, const ActivationCodes* codes, float* amax) {
  dispatch_float(dtype, "layernorm_mlp", [&](auto tag) {
    using S = decltype(tag);
    check((!codes && !amax) || sizeof(S) <= 4, "layernorm_mlp",
          "fp8 codes and amaxes of the activation are made from f32, bf16 or f16, not ", dtype_name(dtype));
    Buffers<S> b{static_cast<const S*>(z), nullptr, static_cast<S*>(a), nullptr, nullptr};
    b.amax_bits = reinterpret_cast<unsigned int*>(amax);
    if (codes) {
      b.codes = static_cast<std::uint8_t*>(codes->codes);
      b.scale = codes->scale;
      b.tile_scales = codes->tile_scales;
      check(!b.tile_scales || (F % fp8::block_tile == 0 && rows % 4 == 0 && sizeof(S) <= 4 &&
                               rows::packs_fit<S>(F, {z, codes->codes, codes->tile_scales})),
            "layernorm_mlp", "the activation's codes in 1x128 tiles need F (", F, ") in whole tiles, rows (", rows,
            ") a multiple of 4 and 16-byte aligned rows");
    }
    launch_activation<S, false>(device, act, b, rows, F);
  });
}

void mlp_activation_backward(DType dtype, int device, const ActivationForm& act, const void* z, const void* da,
                             const ActivationGrads& out, std::int64_t rows, std::int64_t F) {
  dispatch_float(dtype, "layernorm_mlp", [&](auto tag) {
    using S = decltype(tag);
    using C = compute_of<S>;
    C* partials = out.dbias ? static_cast<C*>(out.partials) : nullptr;
    launch_activation<S, true>(device, act,
                               {static_cast<const S*>(z), static_cast<const S*>(da), static_cast<S*>(out.a),
                                static_cast<S*>(out.dz), partials},
                               rows, F);
    if (out.dbias) {
      const DType sums = out.wide_dbias ? compute_dtype(dtype) : dtype;
      const PartialSums db1{partials, out.dbias};
      sum_partials(sums, {&db1, 1}, chunks(rows, F), act.width() * F, device);
    }
  });
}

}  // namespace tapegrad::cuda

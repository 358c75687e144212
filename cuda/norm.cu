// Layer and RMS normalization over the rows of x [rows, hidden] (interface: cuda/norm.hpp; the CPU's formulas:
// ops/detail/norm_rows.hpp).
//
// Forward: a row group per row (cuda/rows.cuh: a warp for rows of up to 1024 elements, the block otherwise),
// three passes over the row, the second and third served by L1/L2: the mean; the variance as a second pass over
// x - mean, as on the CPU (accurate for rows with a large mean and a small spread); then y. Saves mean and rstd.
//
// Backward: the rows are cut into chunks whose size depends only on the number of rows (chunk_rows); block b of
// the one backward kernel takes chunk b.
//   Phase 1, a row group per row: dx̂ = dy·g, dx = rstd·(dx̂ - mean(dx̂) - x̂·mean(dx̂·x̂)) (+ the caller's addend).
//   Phase 2, per column: thread t owns the packs t, t + blockDim, ... of the columns, adds dy·x̂ and dy (and the
//   caller's other rows, NormBackwardArgs::other) over the chunk's rows in row order in registers, and writes them
//   to the block's partial rows.
// sum_partials (cuda/partial_sums.hpp) then adds the partial rows in a fixed order. No atomics, nothing shared
// between blocks: the same inputs give the same bits.
//
// Padded rows (NormProblem::ld > hidden) are read and written in whole packs up to ld, the elements past hidden
// counted as zeros and written as zeros (rows::RowExtent); that is a compile-time variant of each kernel, so rows
// without padding run the plain loads.
#include "tapegrad/cuda/norm.hpp"

#include <algorithm>
#include <array>
#include <type_traits>

#include "tapegrad/cuda/async_copy.cuh"
#include "tapegrad/cuda/fp8_codes.cuh"
#include "tapegrad/cuda/partial_sums.hpp"
#include "tapegrad/cuda/rows.cuh"

namespace tapegrad::cuda {

namespace {

using rows::Sum;

template <class S> struct ForwardParams {
  using C = compute_of<S>;
  const S* x;
  const S* gamma;
  const S* beta;  // null: no shift
  S* y;
  C* mean;  // each of mean, rstd: null when not wanted
  C* rstd;
  std::int64_t rows, hidden, ld;
  C epsilon;
  bool centered;
  C gamma_offset;  // 1 for zero-centered gamma, else 0
  unsigned int* amax_bits;  // null: no amax of y
};

// Stores a pack of y's row, and where y's amax is wanted merges the values as stored into the thread's m.
template <int V, class S, class C>
__device__ __forceinline__ void store_y(S* row, std::int64_t q, const C (&v)[V], const ForwardParams<S>& p,
                                        unsigned int& m) {
  rows::store(row, q, v);
  if (p.amax_bits) {
#pragma unroll
    for (int k = 0; k < V; ++k) m = max(m, abs_bits(from_compute<S>(v[k])));
  }
}

template <class S, class Config, bool Padded>
__global__ void __launch_bounds__(Config::block_threads) norm_forward_kernel(ForwardParams<S> p) {
  wait_for_prior_kernels();
  using C = compute_of<S>;
  constexpr int V = Config::V;
  const rows::RowExtent<V, Padded> m{p.hidden};
  const C count = static_cast<C>(p.hidden);
  unsigned int amax = 0;
  Config::for_each_row(p.rows, [&](std::int64_t r) {
    const S* x = p.x + r * p.ld;
    C mean = 0;
    if (p.centered) {
      C sum = 0;
      Config::for_each_pack(p.ld, [&](std::int64_t q) {
        C v[V];
        m.load(x, q, v);
        for (int k = 0; k < V; ++k) sum += v[k];  // past the row's end v is 0
      });
      mean = Config::reduce(sum, Sum{}) / count;
    }
    C squares = 0;
    Config::for_each_pack(p.ld, [&](std::int64_t q) {
      C v[V];
      m.load(x, q, v);
      for (int k = 0; k < V; ++k) {
        if (m.in_row(q, k)) squares += (v[k] - mean) * (v[k] - mean);
      }
    });
    const C rstd = C(1) / rows::sqrt_of(Config::reduce(squares, Sum{}) / count + p.epsilon);
    if (Config::lane() == 0) {
      if (p.centered && p.mean) p.mean[r] = mean;
      if (p.rstd) p.rstd[r] = rstd;
    }
    Config::for_each_pack(p.ld, [&](std::int64_t q) {
      C v[V], g[V], b[V] = {};
      m.load(x, q, v);
      m.load_vector(p.gamma, q, g);
      if (p.beta) m.load_vector(p.beta, q, b);
      for (int k = 0; k < V; ++k) {
        v[k] = m.in_row(q, k) ? (v[k] - mean) * rstd * (g[k] + p.gamma_offset) + b[k] : C(0);
      }
      store_y(p.y + r * p.ld, q, v, p, amax);
    });
  });
  if (p.amax_bits) merge_amax(amax, p.amax_bits);  // (the same for every thread of the block)
}

template <class S> struct BackwardParams {
  using C = compute_of<S>;
  const S* x;
  const S* gamma;
  const S* dy;
  const S* other;      // rows whose columns are summed too, or null
  const S* dx_addend;  // rows added to dx, or null
  const C* mean;       // layernorm only
  const C* rstd;
  S* dx;               // each of dx and the partials: null when not wanted
  C* dgamma_partials;  // [chunks, hidden]
  C* dbeta_partials;   // [chunks, hidden]
  C* other_partials;   // [chunks, hidden]
  std::int64_t rows, hidden, ld, chunk_rows;
  bool centered;
  C gamma_offset;        // 1 for zero-centered gamma, else 0
  bool packed_partials;  // the partials are 16-byte aligned
};

// Pack q's column sums over the block's rows into its partial row of `partials` (if wanted). Where the partials are
// 16-byte aligned (`packed`) and the rows unpadded, the pack goes out in whole 16-byte stores: one element at a time,
// a warp's store touches a sector for every 4 bytes.
template <int V, bool Padded, class C>
__device__ __forceinline__ void store_partial(C* partials, const rows::RowExtent<V, Padded>& m, std::int64_t q,
                                              const C (&sums)[V], bool packed) {
  if (!partials) return;
  C* row = partials + std::int64_t{blockIdx.x} * m.hidden;
  if (!Padded && packed) {
    rows::store(row, q, sums);
    return;
  }
  for (int k = 0; k < V && m.in_row(q, k); ++k) row[q * V + k] = sums[k];
}

template <class S, class Config, bool Padded>
__global__ void __launch_bounds__(Config::block_threads) norm_backward_kernel(BackwardParams<S> p) {
  wait_for_prior_kernels();
  using C = compute_of<S>;
  constexpr int V = Config::V;
  const rows::RowExtent<V, Padded> m{p.hidden};
  const std::int64_t first = std::int64_t{blockIdx.x} * p.chunk_rows;
  const std::int64_t last = first + p.chunk_rows < p.rows ? first + p.chunk_rows : p.rows;
  const C count = static_cast<C>(p.hidden);
  const auto mean_of = [&](std::int64_t r) { return p.centered ? p.mean[r] : C(0); };

  if (p.dx) {  // phase 1: the row groups of the block take the chunk's rows in turn
    for (std::int64_t r = first + threadIdx.x / Config::threads; r < last; r += Config::rows_per_block) {
      const S* x = p.x + r * p.ld;
      const S* dy = p.dy + r * p.ld;
      const C mean = mean_of(r), rstd = p.rstd[r];
      // Pack q of the row: x̂ and dx̂ = dy·g (0 past the row's end, so the sums below need no mask).
      const auto xhat_dxhat = [&](std::int64_t q, C (&xhat)[V], C (&dxhat)[V]) {
        C g[V];
        m.load(x, q, xhat);
        m.load(dy, q, dxhat);
        m.load_vector(p.gamma, q, g);
        for (int k = 0; k < V; ++k) {
          xhat[k] = (xhat[k] - mean) * rstd;
          dxhat[k] *= g[k] + p.gamma_offset;
        }
      };
      C sum_dxhat = 0, sum_dxhat_xhat = 0;
      Config::for_each_pack(p.ld, [&](std::int64_t q) {
        C xhat[V], dxhat[V];
        xhat_dxhat(q, xhat, dxhat);
        for (int k = 0; k < V; ++k) {
          sum_dxhat += dxhat[k];
          sum_dxhat_xhat += dxhat[k] * xhat[k];
        }
      });
      const rows::Pair<C> sums = Config::reduce(rows::Pair<C>{sum_dxhat, sum_dxhat_xhat}, Sum{});
      const C mean_dxhat = p.centered ? sums.first / count : C(0);
      const C mean_dxhat_xhat = sums.second / count;
      Config::for_each_pack(p.ld, [&](std::int64_t q) {
        C xhat[V], dxhat[V];
        xhat_dxhat(q, xhat, dxhat);
        C added[V] = {};
        if (p.dx_addend) m.load(p.dx_addend + r * p.ld, q, added);
        for (int k = 0; k < V; ++k) {
          dxhat[k] = m.in_row(q, k) ? rstd * (dxhat[k] - mean_dxhat - xhat[k] * mean_dxhat_xhat) + added[k] : C(0);
        }
        rows::store(p.dx + r * p.ld, q, dxhat);
      });
    }
  }

  // Phase 2: each thread its columns, over the chunk's rows in order. A padded row's columns past hidden are summed
  // too, whatever they hold, and never stored (store_partial): the loads need no mask.
  if (p.dgamma_partials || p.dbeta_partials || p.other_partials) {
    const std::int64_t column_packs = Padded ? (p.hidden + V - 1) / V : p.hidden / V;
    for (std::int64_t q = threadIdx.x; q < column_packs; q += blockDim.x) {
      C dgamma[V] = {}, dbeta[V] = {}, other[V] = {};
      for (std::int64_t r = first; r < last && (p.dgamma_partials || p.dbeta_partials); ++r) {
        C dyv[V];
        rows::load(p.dy + r * p.ld, q, dyv);
        if (p.dgamma_partials) {
          C xv[V];
          rows::load(p.x + r * p.ld, q, xv);
          const C mean = mean_of(r), rstd = p.rstd[r];
          for (int k = 0; k < V; ++k) dgamma[k] += dyv[k] * ((xv[k] - mean) * rstd);
        }
        for (int k = 0; k < V; ++k) dbeta[k] += dyv[k];
      }
      // Phase 1 left x and dy in L2, but not the other rows: several rows' loads in flight at once, added in order.
      constexpr int in_flight = 4;
      for (std::int64_t r = first; r < last && p.other_partials; r += in_flight) {
        C v[in_flight][V];
#pragma unroll
        for (int i = 0; i < in_flight; ++i) {
          if (r + i < last) rows::load(p.other + (r + i) * p.ld, q, v[i]);
        }
#pragma unroll
        for (int i = 0; i < in_flight; ++i) {
          for (int k = 0; k < V && r + i < last; ++k) other[k] += v[i][k];
        }
      }
      store_partial(p.dgamma_partials, m, q, dgamma, p.packed_partials);
      store_partial(p.dbeta_partials, m, q, dbeta, p.packed_partials);
      store_partial(p.other_partials, m, q, other, p.packed_partials);
    }
  }
}

// ---- second derivatives (norm_second_order) ------------------------------------------------------------------------
// The backward's layout: block b takes chunk b of the rows. Phase 1, a row group per row, three passes over the row:
// the sums of u, u·x̂, a, a·x̂, u·a (a = dy·g); those of G = cγ·dy - r·(a⟨u x̂⟩ + u⟨a x̂⟩) and G·x̂; then dx and ddy,
// and the row's ⟨u⟩ and ⟨u x̂⟩ kept for phase 2. Phase 2, per column over the chunk's rows in order: the partial sums
// of P·dy, P = r·(u - ⟨u⟩ - x̂⟨u x̂⟩), for dγ.

template <class S> struct SecondOrderParams {
  using C = compute_of<S>;
  const S* x;
  const S* gamma;
  const S* dy;
  const S* u;
  const S* c_gamma;
  const S* c_beta;  // null: no shift
  const C* mean;    // layernorm only
  const C* rstd;
  S* dx;
  S* ddy;
  C* row_terms;        // [rows, 2]: each row's ⟨u⟩ and ⟨u x̂⟩
  C* dgamma_partials;  // [chunks, hidden]
  std::int64_t rows, hidden, chunk_rows;
  bool centered;
  C gamma_offset;        // 1 for zero-centered gamma, else 0
  bool packed_partials;  // the partials are 16-byte aligned
};

template <class S, class Config>
__global__ void __launch_bounds__(Config::block_threads) norm_second_order_kernel(SecondOrderParams<S> p) {
  wait_for_prior_kernels();
  using C = compute_of<S>;
  constexpr int V = Config::V;
  const rows::RowExtent<V, false> m{p.hidden};
  const std::int64_t first = std::int64_t{blockIdx.x} * p.chunk_rows;
  const std::int64_t last = first + p.chunk_rows < p.rows ? first + p.chunk_rows : p.rows;
  const C count = static_cast<C>(p.hidden);

  for (std::int64_t r = first + threadIdx.x / Config::threads; r < last; r += Config::rows_per_block) {
    const std::int64_t row = r * p.hidden;
    const C mean = p.centered ? p.mean[r] : C(0), rstd = p.rstd[r];
    // Pack q of the row: x̂, u, dy, g (γ or 1 + γ), a = dy·g.
    struct Pack {
      C xhat[V], u[V], dy[V], g[V], a[V];
    };
    const auto load_pack = [&](std::int64_t q, Pack& v) {
      m.load(p.x + row, q, v.xhat);
      m.load(p.u + row, q, v.u);
      m.load(p.dy + row, q, v.dy);
      m.load_vector(p.gamma, q, v.g);
      for (int k = 0; k < V; ++k) {
        v.xhat[k] = (v.xhat[k] - mean) * rstd;
        v.g[k] += p.gamma_offset;
        v.a[k] = v.dy[k] * v.g[k];
      }
    };
    C sum_u = 0, sum_u_xhat = 0, sum_a = 0, sum_a_xhat = 0, sum_u_a = 0;
    Config::for_each_pack(p.hidden, [&](std::int64_t q) {
      Pack v;
      load_pack(q, v);
      for (int k = 0; k < V; ++k) {
        sum_u += v.u[k];
        sum_u_xhat += v.u[k] * v.xhat[k];
        sum_a += v.a[k];
        sum_a_xhat += v.a[k] * v.xhat[k];
        sum_u_a += v.u[k] * v.a[k];
      }
    });
    const rows::Pair<C> us = Config::reduce(rows::Pair<C>{sum_u, sum_u_xhat}, Sum{});
    const rows::Pair<C> as = Config::reduce(rows::Pair<C>{sum_a, sum_a_xhat}, Sum{});
    const C u_a = Config::reduce(sum_u_a, Sum{}) / count;
    const C u_mean = p.centered ? us.first / count : C(0), u_xhat = us.second / count;
    const C a_mean = p.centered ? as.first / count : C(0), a_xhat = as.second / count;
    const C s = u_a - a_mean * u_mean - a_xhat * u_xhat;
    // G of pack q (cγ read as a vector, like γ).
    const auto g_of = [&](std::int64_t q, const Pack& v, C (&G)[V]) {
      m.load_vector(p.c_gamma, q, G);
      for (int k = 0; k < V; ++k) G[k] = G[k] * v.dy[k] - rstd * (v.a[k] * u_xhat + v.u[k] * a_xhat);
    };
    C sum_g = 0, sum_g_xhat = 0;
    Config::for_each_pack(p.hidden, [&](std::int64_t q) {
      Pack v;
      load_pack(q, v);
      C G[V];
      g_of(q, v, G);
      for (int k = 0; k < V; ++k) {
        sum_g += G[k];
        sum_g_xhat += G[k] * v.xhat[k];
      }
    });
    const rows::Pair<C> gs = Config::reduce(rows::Pair<C>{sum_g, sum_g_xhat}, Sum{});
    const C g_mean = p.centered ? gs.first / count : C(0), g_xhat = gs.second / count;
    Config::for_each_pack(p.hidden, [&](std::int64_t q) {
      Pack v;
      load_pack(q, v);
      C G[V], c_gamma[V], c_beta[V] = {}, dx[V], ddy[V];
      g_of(q, v, G);
      m.load_vector(p.c_gamma, q, c_gamma);
      if (p.c_beta) m.load_vector(p.c_beta, q, c_beta);
      for (int k = 0; k < V; ++k) {
        dx[k] = rstd * (G[k] - g_mean - v.xhat[k] * g_xhat) - rstd * rstd * v.xhat[k] * s;
        const C P = rstd * (v.u[k] - u_mean - v.xhat[k] * u_xhat);
        ddy[k] = P * v.g[k] + c_gamma[k] * v.xhat[k] + c_beta[k];
      }
      rows::store(p.dx + row, q, dx);
      rows::store(p.ddy + row, q, ddy);
    });
    if (Config::lane() == 0) {
      p.row_terms[2 * r] = u_mean;
      p.row_terms[2 * r + 1] = u_xhat;
    }
  }
  __syncthreads();  // the chunk's row terms, written by every row group of the block

  // Phase 2: each thread its columns, over the chunk's rows in order.
  for (std::int64_t q = threadIdx.x; q < p.hidden / V; q += blockDim.x) {
    C dgamma[V] = {};
    for (std::int64_t r = first; r < last; ++r) {
      C xv[V], uv[V], dyv[V];
      rows::load(p.x + r * p.hidden, q, xv);
      rows::load(p.u + r * p.hidden, q, uv);
      rows::load(p.dy + r * p.hidden, q, dyv);
      const C mean = p.centered ? p.mean[r] : C(0), rstd = p.rstd[r];
      const C u_mean = p.row_terms[2 * r], u_xhat = p.row_terms[2 * r + 1];
      for (int k = 0; k < V; ++k) dgamma[k] += rstd * (uv[k] - u_mean - (xv[k] - mean) * rstd * u_xhat) * dyv[k];
    }
    store_partial(p.dgamma_partials, m, q, dgamma, p.packed_partials);
  }
}

// ---- rows held in registers: long rows of 16-byte packs, up to P packs per thread --------------------------------
// The kernels above read a row once per pass (three passes forward, two backward, and backward reads x and dy once
// more per column for dγ/dβ): the later passes mostly hit L1/L2, but each pass waits for its loads. These keep a
// row's packs in registers: every load of a row in flight at once, one read of x (and dy) from memory, and backward
// adds each thread's dγ/dβ columns over its chunk's rows as it goes. A block of cached_threads per row, thread t
// holding packs t, t + cached_threads, ...: the same columns in every row, so the partials keep the fixed order.

constexpr int cached_threads = 256;
using CachedGroup = rows::RowGroup<cached_threads>;

// Pack i of this thread's share of a row: its index, or -1 past the row's end.
__device__ __forceinline__ std::int64_t cached_pack(int i, std::int64_t packs) {
  const std::int64_t q = threadIdx.x + std::int64_t{i} * cached_threads;
  return q < packs ? q : -1;
}

template <class S, int P, bool Padded>
__global__ void __launch_bounds__(cached_threads) norm_forward_cached_kernel(ForwardParams<S> p) {
  wait_for_prior_kernels();
  using C = compute_of<S>;
  constexpr int V = rows::wide_pack<S>;
  const rows::RowExtent<V, Padded> m{p.hidden};
  const std::int64_t packs = p.ld / V;
  const C count = static_cast<C>(p.hidden);
  unsigned int amax = 0;
  for (std::int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const S* x = p.x + r * p.ld;
    C v[P][V] = {};
#pragma unroll
    for (int i = 0; i < P; ++i) {
      if (const std::int64_t q = cached_pack(i, packs); q >= 0) m.load(x, q, v[i]);
    }
    C mean = 0;
    if (p.centered) {
      C sum = 0;
#pragma unroll
      for (int i = 0; i < P; ++i) {
        for (int k = 0; k < V; ++k) sum += v[i][k];  // past the row's end v is 0
      }
      mean = CachedGroup::reduce(sum, Sum{}) / count;
    }
    C squares = 0;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const std::int64_t q = cached_pack(i, packs);
      if (q < 0) continue;
      for (int k = 0; k < V; ++k) {
        if (m.in_row(q, k)) squares += (v[i][k] - mean) * (v[i][k] - mean);
      }
    }
    const C rstd = C(1) / rows::sqrt_of(CachedGroup::reduce(squares, Sum{}) / count + p.epsilon);
    if (threadIdx.x == 0) {
      if (p.centered && p.mean) p.mean[r] = mean;
      if (p.rstd) p.rstd[r] = rstd;
    }
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const std::int64_t q = cached_pack(i, packs);
      if (q < 0) continue;
      C g[V], b[V] = {};
      m.load_vector(p.gamma, q, g);
      if (p.beta) m.load_vector(p.beta, q, b);
      for (int k = 0; k < V; ++k) {
        v[i][k] = m.in_row(q, k) ? (v[i][k] - mean) * rstd * (g[k] + p.gamma_offset) + b[k] : C(0);
      }
      store_y(p.y + r * p.ld, q, v[i], p, amax);
    }
  }
  if (p.amax_bits) merge_amax(amax, p.amax_bits);  // (the same for every thread of the block)
}

// The rows' x and dy (and a third input: other, or the dx addend, which layernorm_mlp's residual makes the same rows)
// are copied ahead into shared memory with cp.async, `staged_rows` rows ahead of the one being worked on: the loads
// of the next rows stay in flight through this row's reductions and stores, without holding registers (a 16-bit row
// of 4096 is only 16 KB of x and dy, so one row ahead did not cover the latency: bf16 reached 75 % of the card's
// copy). Each thread copies and reads back only its own packs: no barrier guards the
// stages. Up to 16 values per thread (two packs of 16-bit types, four of f32) fit 2 blocks per SM; more take one.
template <int P> constexpr int staged_rows = P == 2 ? 3 : 2;
constexpr int max_staged_inputs = 3;  // x, dy, the third
// The third input staged per row: the other rows where their columns are summed, else the dx addend, or none.
template <class S> __host__ __device__ const S* staged_third(const BackwardParams<S>& p) {
  return p.other_partials ? p.other : p.dx_addend;
}
template <class S> __host__ __device__ int staged_inputs(const BackwardParams<S>& p) {
  return staged_third(p) ? 3 : 2;
}
template <int P> constexpr std::size_t staging_bytes(int inputs) {
  return std::size_t{staged_rows<P>} * static_cast<std::size_t>(inputs) * P * cached_threads * 16;
}

template <class S, int P, bool Padded>
__global__ void __launch_bounds__(cached_threads, P * rows::wide_pack<S> <= 16 ? 2 : 1)
    norm_backward_cached_kernel(BackwardParams<S> p) {
  wait_for_prior_kernels();
  using C = compute_of<S>;
  constexpr int V = rows::wide_pack<S>, stages = staged_rows<P>;
  const rows::RowExtent<V, Padded> m{p.hidden};
  using Raw = Pack<S, V>;
  const int inputs = staged_inputs(p);
  const S* const third = staged_third(p);
  const bool third_added = p.dx_addend && p.dx_addend == third;  // else the addend is read when dx is written
  extern __shared__ uint4 staging[];  // [stage][x, dy, third][pack i][thread], 16 bytes each
  const auto slot = [&](int stage, int input, int i) -> Raw* {
    return reinterpret_cast<Raw*>(&staging[((stage * inputs + input) * P + i) * cached_threads + threadIdx.x]);
  };
  const std::int64_t packs = p.ld / V;
  const std::int64_t first = std::int64_t{blockIdx.x} * p.chunk_rows;
  const std::int64_t last = first + p.chunk_rows < p.rows ? first + p.chunk_rows : p.rows;
  const C count = static_cast<C>(p.hidden);
  // Row r's packs into stage `stage`, as one group of copies (an empty group past the chunk: one group per row).
  const auto fetch = [&](std::int64_t r, int stage) {
    if (r < last) {
#pragma unroll
      for (int i = 0; i < P; ++i) {
        if (const std::int64_t q = cached_pack(i, packs); q >= 0) {
          copy_16_async(slot(stage, 0, i), p.x + r * p.ld + q * V);
          copy_16_async(slot(stage, 1, i), p.dy + r * p.ld + q * V);
          if (third) copy_16_async(slot(stage, 2, i), third + r * p.ld + q * V);
        }
      }
    }
    commit_async_copies();
  };
  for (int stage = 0; stage < stages; ++stage) fetch(first + stage, stage);
  C dgamma[P][V] = {}, dbeta[P][V] = {}, other[P][V] = {};
  for (std::int64_t r = first; r < last; ++r) {
    const int stage = static_cast<int>((r - first) % stages);
    const C mean = p.centered ? p.mean[r] : C(0), rstd = p.rstd[r];
    wait_async_copies<stages - 1>();  // row r's group has landed
    C xhat[P][V] = {}, dy[P][V] = {}, added[P][V] = {};  // 0 past the row's end: they add nothing below
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const std::int64_t q = cached_pack(i, packs);
      if (q < 0) continue;
      const Raw x_pack = *slot(stage, 0, i), dy_pack = *slot(stage, 1, i);
      for (int k = 0; k < V; ++k) {
        if (!m.in_row(q, k)) continue;
        xhat[i][k] = (to_compute<C>(x_pack.v[k]) - mean) * rstd;
        dy[i][k] = to_compute<C>(dy_pack.v[k]);
      }
      if (third) {
        const Raw third_pack = *slot(stage, 2, i);
        for (int k = 0; k < V; ++k) {
          const C v = to_compute<C>(third_pack.v[k]);
          if (p.other_partials) other[i][k] += v;  // past hidden: never stored
          if (third_added) added[i][k] = v;
        }
      }
      if (p.dx_addend && !third_added) m.load(p.dx_addend + r * p.ld, q, added[i]);
    }
    fetch(r + stages, stage);  // the stage is read: refill it
#pragma unroll
    for (int i = 0; i < P; ++i) {
      for (int k = 0; k < V; ++k) {
        dgamma[i][k] += dy[i][k] * xhat[i][k];
        dbeta[i][k] += dy[i][k];
      }
    }
    if (p.dx) {  // dy becomes dx̂ = dy·g, then dx
      C sum_dxhat = 0, sum_dxhat_xhat = 0;
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const std::int64_t q = cached_pack(i, packs);
        if (q < 0) continue;
        C g[V];
        m.load_vector(p.gamma, q, g);
        for (int k = 0; k < V; ++k) {
          dy[i][k] *= g[k] + p.gamma_offset;
          sum_dxhat += dy[i][k];
          sum_dxhat_xhat += dy[i][k] * xhat[i][k];
        }
      }
      const rows::Pair<C> sums = CachedGroup::reduce(rows::Pair<C>{sum_dxhat, sum_dxhat_xhat}, Sum{});
      const C mean_dxhat = p.centered ? sums.first / count : C(0);
      const C mean_dxhat_xhat = sums.second / count;
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const std::int64_t q = cached_pack(i, packs);
        if (q < 0) continue;
        for (int k = 0; k < V; ++k) {
          dy[i][k] = m.in_row(q, k) ? rstd * (dy[i][k] - mean_dxhat - xhat[i][k] * mean_dxhat_xhat) + added[i][k]
                                    : C(0);
        }
        rows::store(p.dx + r * p.ld, q, dy[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const std::int64_t q = cached_pack(i, packs);
    if (q < 0) continue;
    store_partial(p.dgamma_partials, m, q, dgamma[i], p.packed_partials);
    store_partial(p.dbeta_partials, m, q, dbeta[i], p.packed_partials);
    store_partial(p.other_partials, m, q, other[i], p.packed_partials);
  }
}

// Calls fn(std::integral_constant<int, P>) with the packs per thread that hold a row of n elements of S in registers,
// or returns false where the cached kernels do not take the row: short rows (a warp each, above), rows that are
// not read in packs, or rows longer than cached_threads · 4 packs.
template <class S, class Fn> bool dispatch_cached(std::int64_t n, bool wide, Fn&& fn) {
  const std::int64_t packs = n / rows::wide_pack<S>;
  if (!wide || n <= rows::warp_row_limit || packs > 4 * cached_threads) return false;
  if (packs <= 2 * cached_threads) fn(std::integral_constant<int, 2>{});
  else fn(std::integral_constant<int, 4>{});
  return true;
}

// Rows per backward block: at least 8 (a row per warp in warp mode), up to 32 while that leaves 256 blocks or more
// (a block's staging pipeline fills and drains once: 8-row blocks spent much of their time doing so, and wrote a
// partial row per 8 rows), and more where needed to stay at 1024 blocks at most, which bounds the partials and the
// work of sum_partials. A function of the row count only.
std::int64_t chunk_rows(std::int64_t rows) {
  return std::max({std::int64_t{8}, std::min<std::int64_t>(32, rows / 256), (rows + 1023) / 1024});
}
std::int64_t chunks(std::int64_t rows) { return (rows + chunk_rows(rows) - 1) / chunk_rows(rows); }

// Elements between rows: ld, or hidden where ld is 0.
std::int64_t row_stride(const NormProblem& problem, const char* op) {
  check(problem.ld == 0 || problem.ld >= problem.hidden, op, "rows of ", problem.hidden, " elements cannot lie ",
        problem.ld, " apart");
  return problem.ld == 0 ? problem.hidden : problem.ld;
}

// The column sums norm_backward is asked for, in the order of their partial rows: dγ, dβ, other's.
std::array<void*, max_partial_sums> column_sums_of(const NormBackwardArgs& args) {
  return {args.dgamma, args.dbeta, args.other_sums};
}

// How many of them are asked for: the partial rows per block of rows.
std::int64_t sums_wanted(const NormBackwardArgs& args) {
  const auto sums = column_sums_of(args);
  return std::count_if(sums.begin(), sums.end(), [](const void* sum) { return sum != nullptr; });
}

}  // namespace

void norm_forward(const NormProblem& problem, const NormForwardArgs& args, int device) {
  const std::int64_t ld = row_stride(problem, "norm_forward");
  if (problem.rows == 0 || problem.hidden == 0) return;
  Launch launch(device);
  dispatch_float(problem.dtype, "norm_forward", [&](auto tag) {
    using S = decltype(tag);
    using C = compute_of<S>;
    const ForwardParams<S> p{static_cast<const S*>(args.x),
                             static_cast<const S*>(args.gamma),
                             static_cast<const S*>(args.beta),
                             static_cast<S*>(args.y),
                             static_cast<C*>(args.mean),
                             static_cast<C*>(args.rstd),
                             problem.rows,
                             problem.hidden,
                             ld,
                             static_cast<C>(args.epsilon),
                             problem.centered,
                             problem.zero_centered_gamma ? C(1) : C(0),
                             reinterpret_cast<unsigned int*>(args.amax)};
    const bool wide = rows::packs_fit<S>(ld, {args.x, args.gamma, args.beta, args.y});
    rows::dispatch_padded(ld != problem.hidden, [&](auto padded) {
      const bool cached = dispatch_cached<S>(ld, wide, [&](auto packs_per_thread) {
        launch_overlapped(launch, norm_forward_cached_kernel<S, packs_per_thread(), padded()>,
                          launch.blocks_for(problem.rows * cached_threads, cached_threads), cached_threads, 0, p);
      });
      if (cached) return;
      rows::dispatch_rows<S>(ld, wide, [&](auto config) {
        using Config = decltype(config);
        launch_overlapped(launch, norm_forward_kernel<S, Config, padded()>,
                          rows::row_blocks<Config>(launch, problem.rows), Config::block_threads, 0, p);
      });
    });
  });
}

std::int64_t norm_backward_partials(const NormProblem& problem, const NormBackwardArgs& args) {
  return chunks(problem.rows) * problem.hidden * sums_wanted(args);
}

void norm_backward(const NormProblem& problem, const NormBackwardArgs& args, int device) {
  const std::int64_t ld = row_stride(problem, "norm_backward");
  check(!args.other == !args.other_sums || problem.rows == 0, "norm_backward",
        "other and other_sums come together (other is ", args.other ? "set" : "null", ", other_sums ",
        args.other_sums ? "set" : "null", ")");
  if (problem.hidden == 0 || (!args.dx && sums_wanted(args) == 0)) return;
  const auto wanted = column_sums_of(args);
  Launch launch(device);
  dispatch_float(problem.dtype, "norm_backward", [&](auto tag) {
    using S = decltype(tag);
    using C = compute_of<S>;
    const std::int64_t blocks = chunks(problem.rows);
    // Each sum asked for gets the next [blocks, hidden] of the scratch, in column_sums_of's order.
    std::array<C*, max_partial_sums> partials{};
    PartialSums sums[max_partial_sums];
    int count = 0;
    for (std::size_t i = 0; i < wanted.size(); ++i) {
      if (!wanted[i]) continue;
      partials[i] = static_cast<C*>(args.partials) + count * blocks * problem.hidden;
      sums[count++] = {partials[i], wanted[i]};
    }
    if (blocks > 0) {
      const BackwardParams<S> p{static_cast<const S*>(args.x),
                                static_cast<const S*>(args.gamma),
                                static_cast<const S*>(args.dy),
                                static_cast<const S*>(args.other),
                                static_cast<const S*>(args.dx_addend),
                                static_cast<const C*>(args.mean),
                                static_cast<const C*>(args.rstd),
                                static_cast<S*>(args.dx),
                                partials[0],
                                partials[1],
                                partials[2],
                                problem.rows,
                                problem.hidden,
                                ld,
                                chunk_rows(problem.rows),
                                problem.centered,
                                problem.zero_centered_gamma ? C(1) : C(0),
                                aligned_16(args.partials)};
      const bool wide = rows::packs_fit<S>(ld, {args.x, args.gamma, args.dy, args.dx, args.other, args.dx_addend});
      rows::dispatch_padded(ld != problem.hidden, [&](auto padded) {
        const bool cached = dispatch_cached<S>(ld, wide, [&](auto packs_per_thread) {
          constexpr int P = packs_per_thread();
          const auto kernel = norm_backward_cached_kernel<S, P, padded()>;
          // With the reductions' static shared memory the block needs more than the default 48 KB: ask for it.
          TAPEGRAD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(staging_bytes<P>(max_staged_inputs))));
          launch_overlapped(launch, kernel, static_cast<unsigned>(blocks), cached_threads,
                            staging_bytes<P>(staged_inputs(p)), p);
        });
        if (cached) return;
        rows::dispatch_rows<S>(ld, wide, [&](auto config) {
          using Config = decltype(config);
          launch_overlapped(launch, norm_backward_kernel<S, Config, padded()>, static_cast<unsigned>(blocks),
                            Config::block_threads, 0, p);
        });
      });
    }
    const DType grads = args.wide_parameter_grads ? compute_dtype(problem.dtype) : problem.dtype;
    sum_partials(grads, std::span(sums, count), blocks, problem.hidden, device);  // all of them in one launch
  });
}

std::int64_t norm_second_order_scratch(const NormProblem& problem) {
  return chunks(problem.rows) * problem.hidden + 2 * problem.rows;
}

void norm_second_order(const NormProblem& problem, const NormSecondOrderArgs& args, int device) {
  check(problem.ld == 0 || problem.ld == problem.hidden, "norm_second_order", "rows of ", problem.hidden,
        " elements must lie next to each other, not ", problem.ld, " apart");
  if (problem.hidden == 0) return;
  Launch launch(device);
  dispatch_float(problem.dtype, "norm_second_order", [&](auto tag) {
    using S = decltype(tag);
    using C = compute_of<S>;
    const std::int64_t blocks = chunks(problem.rows);
    C* partials = static_cast<C*>(args.scratch);
    if (blocks > 0) {
      const SecondOrderParams<S> p{static_cast<const S*>(args.x),
                                   static_cast<const S*>(args.gamma),
                                   static_cast<const S*>(args.dy),
                                   static_cast<const S*>(args.u),
                                   static_cast<const S*>(args.c_gamma),
                                   static_cast<const S*>(args.c_beta),
                                   static_cast<const C*>(args.mean),
                                   static_cast<const C*>(args.rstd),
                                   static_cast<S*>(args.dx),
                                   static_cast<S*>(args.ddy),
                                   partials + blocks * problem.hidden,
                                   partials,
                                   problem.rows,
                                   problem.hidden,
                                   chunk_rows(problem.rows),
                                   problem.centered,
                                   problem.zero_centered_gamma ? C(1) : C(0),
                                   aligned_16(args.scratch)};
      const bool wide = rows::packs_fit<S>(problem.hidden, {args.x, args.gamma, args.dy, args.u, args.c_gamma,
                                                            args.c_beta, args.dx, args.ddy});
      rows::dispatch_rows<S>(problem.hidden, wide, [&](auto config) {
        using Config = decltype(config);
        launch_overlapped(launch, norm_second_order_kernel<S, Config>, static_cast<unsigned>(blocks),
                          Config::block_threads, 0, p);
      });
    }
    const PartialSums sum{partials, args.dgamma};
    sum_partials(problem.dtype, std::span(&sum, 1), blocks, problem.hidden, device);
  });
}

}  // namespace tapegrad::cuda

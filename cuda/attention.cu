// dot_product_attention on the GPU: the FlashAttention algorithm on CUDA cores, in the compute type C (f32 for
// f32/bf16/f16, f64 for f64), the same three passes as the CPU's (ops/detail/flash_attention.hpp).
//
//   forward   a block per (batch·head, tile of Br queries): Q in shared memory, the keys walked in tiles of Bc with
//             an online softmax; O in registers, rescaled as each row's max grows; writes O and the log-sum-exp.
//   dK, dV    a block per (batch·kv head, tile of Bc keys): K, V in shared memory and dK, dV in registers, over the
//             q heads of the group and the tiles of queries in order, recomputing P = exp(S - lse) and
//             dS = P∘(dO·Vᵀ - δ) (dropout's mask applied to both), δ = rowsum(dO∘O) from a first small kernel.
//   dQ, dbias a block per (tile of Br queries, the batch·head a bias row block serves): dQ in registers; a broadcast
//             bias's gradient is summed over the batches and heads it serves by the one thread that owns each of
//             its elements, in order.
// Every output element is summed by one thread in a fixed order: the same bits on every run. A block is 256 threads,
// a 16 × 16 grid over each tile: a thread owns rows ty + 16·i and columns tx + 16·j. Shared rows are padded to a
// multiple of 16 plus one element, so that threads reading one column of consecutive rows hit distinct banks.
// bf16 and f16 problems that cuDNN's fused flash attention takes run there instead (cuda/cudnn_attention.hpp:
// tensor cores); these kernels are the rest's (f32, f64, dropout, a bias, lengths, windows), correct and
// memory-linear.
#include "tapegrad/cuda/attention.hpp"

#include <atomic>
#include <cmath>

#include "tapegrad/cuda/cudnn_attention.hpp"
#include "tapegrad/cuda/rows.cuh"
#include "tapegrad/cuda/settings.hpp"
#include "tapegrad/tensor/gpu/detail/launch.cuh"

namespace tapegrad::cuda {

namespace {

using attention::Problem;
using attention::RowStrides;

constexpr int threads = 256, side = 16, warps = threads / 32;

// Tile sizes per compute type: rows of queries and keys per block in each pass, so that the shared tiles of a head
// size of 256 fit in a block's 227 KB.
template <class C> struct Tiles {
  static constexpr int forward_q = 64, forward_k = 64, kv_q = 32, kv_k = 64, q_q = 32, q_k = 64;
};
template <> struct Tiles<double> {
  static constexpr int forward_q = 32, forward_k = 32, kv_q = 16, kv_k = 32, q_q = 16, q_k = 32;
};

__host__ __device__ constexpr int padded(std::int64_t width) { return static_cast<int>((width + 15) / 16 * 16); }

using rows::exp_of;
using rows::log_of;
template <class C> __device__ C minus_infinity() { return -rows::infinity_of<C>(); }
template <class X> __device__ X larger(X a, X b) { return a < b ? b : a; }
template <class X> __device__ X smaller(X a, X b) { return b < a ? b : a; }

template <class C> __device__ C warp_max(C v) {
  for (int offset = 16; offset > 0; offset /= 2) v = larger(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
template <class C> __device__ C warp_sum(C v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Rows [first, first + rows) of head (b, h) of t into tile (row stride ld) in C, `width` features and zeros to
// `pad` features; rows from `limit` on are zeros.
template <class S, class C>
__device__ void load_tile(C* tile, int rows, int ld, int pad, const S* t, const RowStrides& s, std::int64_t b,
                          std::int64_t h, std::int64_t first, std::int64_t limit, std::int64_t width) {
  for (int e = threadIdx.x; e < rows * pad; e += threads) {
    const int r = e / pad, d = e % pad;
    const std::int64_t row = first + r;
    tile[r * ld + d] = row < limit && d < width ? to_compute<C>(t[s.at(b, h, row) + d]) : C(0);
  }
}

// The K and V tiles of keys [j0, j0 + Bc) of kv head kvh.
template <class S, class C>
__device__ void load_keys(const Problem& p, C* sK, C* sV, int Bc, int ldq, int ldv, const S* k, const S* v,
                          std::int64_t b, std::int64_t kvh, std::int64_t j0) {
  load_tile(sK, Bc, ldq, padded(p.D), k, p.k, b, kvh, j0, p.Sk, p.D);
  load_tile(sV, Bc, ldv, padded(p.Dv), v, p.v, b, kvh, j0, p.Sk, p.Dv);
}

template <class C, int R, int N> __device__ void set_zero(C (&a)[R][N]) {
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int j = 0; j < N; ++j) a[i][j] = 0;
  }
}

// A thread's entries of a tile (rows ty + 16·i, columns tx + 16·j) into shared memory of row stride ld.
template <class C, int R, int K> __device__ void store_owned(const C (&a)[R][K], C* tile, int ld) {
  const int ty = threadIdx.x / side, tx = threadIdx.x % side;
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int j = 0; j < K; ++j) tile[(ty + side * i) * ld + tx + side * j] = a[i][j];
  }
}

// out[i][j] = Σ_d A[ty + 16·i][d]·B[tx + 16·j][d] over d < width: a thread's entries of A·Bᵀ from shared tiles.
template <class C, int R, int K>
__device__ void tile_dots(const C* A, int lda, const C* B, int ldb, int width, C (&out)[R][K]) {
  const int ty = threadIdx.x / side, tx = threadIdx.x % side;
  set_zero(out);
  for (int d = 0; d < width; ++d) {
    C a[R], b[K];
#pragma unroll
    for (int i = 0; i < R; ++i) a[i] = A[(ty + side * i) * lda + d];
#pragma unroll
    for (int j = 0; j < K; ++j) b[j] = B[(tx + side * j) * ldb + d];
#pragma unroll
    for (int i = 0; i < R; ++i) {
#pragma unroll
      for (int j = 0; j < K; ++j) out[i][j] = fma(a[i], b[j], out[i][j]);
    }
  }
}

// A thread's accumulator rows (ty + 16·i, columns tx + 16·j) times `factor` into rows first + ... of head (b, h) of
// out (strides s): the rows below `limit`, the columns below `width`.
template <class S, class C, int R, int N>
__device__ void store_owned_rows(const C (&a)[R][N], C factor, S* out, const RowStrides& s, std::int64_t b,
                                 std::int64_t h, std::int64_t first, std::int64_t limit, std::int64_t width) {
  const int ty = threadIdx.x / side, tx = threadIdx.x % side;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const std::int64_t row = first + ty + side * i;
    if (row >= limit) continue;
    S* to = out + s.at(b, h, row);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int d = tx + side * j;
      if (d < width) to[d] = from_compute<S>(a[i][j] * factor);
    }
  }
}

// The key ranges of queries [i0, i0 + rows) of batch b, into shared arrays.
__device__ void load_ranges(const Problem& p, std::int64_t b, std::int64_t i0, int rows, std::int64_t* begin,
                            std::int64_t* end) {
  for (int r = threadIdx.x; r < rows; r += threads) p.key_range(b, i0 + r, begin[r], end[r]);
}

// The keys any of `rows` queries sees: [first, last), empty when first >= last.
__device__ void key_span(const std::int64_t* begin, const std::int64_t* end, int rows, std::int64_t& first,
                         std::int64_t& last) {
  first = INT64_MAX;
  last = 0;
  for (int r = 0; r < rows; ++r) {
    if (end[r] <= begin[r]) continue;
    first = smaller(first, begin[r]);
    last = larger(last, end[r]);
  }
}

// Shared memory handed out in order (the int64 arrays first, so that every array stays aligned).
struct Carve {
  unsigned char* at;
  template <class X> __device__ X* take(std::int64_t count) {
    X* out = reinterpret_cast<X*>(at);
    at += count * static_cast<std::int64_t>(sizeof(X));
    return out;
  }
};

// The scaled, biased score of query row (b, h, row) and key col, or -inf where the mask hides it.
template <class S, class C>
__device__ C masked_score(const Problem& p, const S* bias, C dot, std::int64_t b, std::int64_t h, std::int64_t row,
                          std::int64_t col, std::int64_t begin, std::int64_t end) {
  if (col < begin || col >= end) return minus_infinity<C>();
  C s = dot * static_cast<C>(p.scale);
  if (p.has_bias) s += to_compute<C>(bias[p.bias_at(b, h, row) + col]);
  return s;
}

template <class S, int Slots>
__global__ void __launch_bounds__(threads) attention_forward_kernel(const Problem p, const S* q, const S* k,
                                                                    const S* v, const S* bias, S* o,
                                                                    compute_of<S>* log_sums) {
  using C = compute_of<S>;
  constexpr int Br = Tiles<C>::forward_q, Bc = Tiles<C>::forward_k, R = Br / side, K = Bc / side;
  wait_for_prior_kernels();
  extern __shared__ __align__(16) unsigned char shared[];
  const int Dp = padded(p.D), Dvp = padded(p.Dv), ldq = Dp + 1, ldv = Dvp + 1, lds = Bc + 1;
  Carve carve{shared};
  std::int64_t* row_begin = carve.take<std::int64_t>(Br);
  std::int64_t* row_end = carve.take<std::int64_t>(Br);
  C* sQ = carve.take<C>(Br * ldq);
  C* sK = carve.take<C>(Bc * ldq);
  C* sV = carve.take<C>(Bc * ldv);
  C* sS = carve.take<C>(Br * lds);
  C* row_max = carve.take<C>(Br);
  C* row_sum = carve.take<C>(Br);
  C* row_scale = carve.take<C>(Br);

  const std::int64_t bh = blockIdx.x, b = bh / p.q_heads, h = bh % p.q_heads, kvh = p.kv_head(h);
  const std::int64_t i0 = static_cast<std::int64_t>(blockIdx.y) * Br;
  const int tid = threadIdx.x, ty = tid / side, tx = tid % side, warp = tid / 32, lane = tid % 32;
  load_ranges(p, b, i0, Br, row_begin, row_end);
  for (int r = tid; r < Br; r += threads) {
    row_max[r] = minus_infinity<C>();
    row_sum[r] = 0;
  }
  load_tile(sQ, Br, ldq, Dp, q, p.q, b, h, i0, p.Sq, p.D);
  __syncthreads();
  std::int64_t first, last;
  key_span(row_begin, row_end, Br, first, last);
  const C keep_scale = static_cast<C>(1.0 / (1.0 - p.dropout));

  C acc[R][Slots];
  set_zero(acc);
  for (std::int64_t j0 = first; j0 < last; j0 += Bc) {
    load_keys(p, sK, sV, Bc, ldq, ldv, k, v, b, kvh, j0);
    __syncthreads();
    C s[R][K];
    tile_dots(sQ, ldq, sK, ldq, Dp, s);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int r = ty + side * i;
#pragma unroll
      for (int j = 0; j < K; ++j) {
        const int c = tx + side * j;
        sS[r * lds + c] = masked_score(p, bias, s[i][j], b, h, i0 + r, j0 + c, row_begin[r], row_end[r]);
      }
    }
    __syncthreads();
    // The online softmax, a warp per row: the block's max, the rescale of what came before, the probabilities.
    for (int r = warp; r < Br; r += warps) {
      C block_max = minus_infinity<C>();
      for (int c = lane; c < Bc; c += 32) block_max = larger(block_max, sS[r * lds + c]);
      block_max = warp_max(block_max);
      const C old_max = row_max[r], new_max = larger(old_max, block_max);
      const bool seen = new_max != minus_infinity<C>();
      C total = 0;
      for (int c = lane; c < Bc; c += 32) {
        const C e = seen ? exp_of(sS[r * lds + c] - new_max) : C(0);
        total += e;
        const bool kept = p.dropout == 0 || p.kept(b, h, i0 + r, j0 + c);
        sS[r * lds + c] = kept ? (p.dropout > 0 ? e * keep_scale : e) : C(0);
      }
      total = warp_sum(total);
      __syncwarp();  // every lane has read row_max[r] before lane 0 writes it
      if (lane == 0) {
        const C rescale = seen ? exp_of(old_max - new_max) : C(1);
        row_scale[r] = rescale;
        row_sum[r] = row_sum[r] * rescale + total;
        row_max[r] = new_max;
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const C f = row_scale[ty + side * i];
#pragma unroll
      for (int j = 0; j < Slots; ++j) acc[i][j] *= f;
    }
    for (int c = 0; c < Bc; ++c) {
      C pc[R];
#pragma unroll
      for (int i = 0; i < R; ++i) pc[i] = sS[(ty + side * i) * lds + c];
#pragma unroll
      for (int j = 0; j < Slots; ++j) {
        const int d = tx + side * j;
        if (d >= Dvp) break;
        const C vd = sV[c * ldv + d];
#pragma unroll
        for (int i = 0; i < R; ++i) acc[i][j] = fma(pc[i], vd, acc[i][j]);
      }
    }
    __syncthreads();  // the next tile overwrites sK, sV and sS
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {  // normalized: a row that saw no key has a sum of 0 and gives zeros
    const C l = row_sum[ty + side * i], inverse = l > 0 ? C(1) / l : C(0);
#pragma unroll
    for (int j = 0; j < Slots; ++j) acc[i][j] *= inverse;
  }
  store_owned_rows(acc, C(1), o, p.o, b, h, i0, p.Sq, p.Dv);
  for (int r = tid; r < Br; r += threads) {
    if (i0 + r >= p.Sq) continue;
    log_sums[bh * p.Sq + i0 + r] = row_sum[r] > 0 ? row_max[r] + log_of(row_sum[r]) : minus_infinity<C>();
  }
}

// Each batch element's valid queries and keys as int32.
__global__ void attention_lengths_kernel(const Problem p, std::int32_t* queries, std::int32_t* keys) {
  for (std::int64_t b = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; b < p.batch;
       b += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    queries[b] = static_cast<std::int32_t>(p.q_lengths ? p.q_lengths[b] : p.Sq);
    keys[b] = static_cast<std::int32_t>(p.kv_lengths ? p.kv_lengths[b] : p.Sk);
  }
}

// Zeros in the rows of t [batch, heads, S, width] (strides r) from each batch element's length on: its queries' (S =
// Sq, and -inf in log_sums' rows when not null) or its keys' (S = Sk).
template <class S>
__global__ void attention_clear_padding_kernel(const Problem p, S* t, const RowStrides r, std::int64_t heads,
                                               std::int64_t width, bool queries, compute_of<S>* log_sums) {
  const std::int64_t rows = queries ? p.Sq : p.Sk, n = p.batch * heads * rows * width;
  const std::int64_t* lengths = queries ? p.q_lengths : p.kv_lengths;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t d = e % width, row = e / width % rows, bh = e / width / rows, b = bh / heads, h = bh % heads;
    if (!lengths || row < lengths[b]) continue;
    t[r.at(b, h, row) + d] = from_compute<S>(compute_of<S>(0));
    if (log_sums && d == 0) log_sums[bh * rows + row] = minus_infinity<compute_of<S>>();
  }
}

// δ = rowsum(dO∘O), a warp per row.
template <class S>
__global__ void __launch_bounds__(threads) attention_delta_kernel(const Problem p, const S* o, const S* dout,
                                                                  compute_of<S>* delta) {
  using C = compute_of<S>;
  wait_for_prior_kernels();
  const std::int64_t rows = p.batch * p.q_heads * p.Sq;
  const int lane = threadIdx.x % 32;
  for (std::int64_t row = (static_cast<std::int64_t>(blockIdx.x) * threads + threadIdx.x) / 32; row < rows;
       row += static_cast<std::int64_t>(gridDim.x) * warps) {
    const std::int64_t i = row % p.Sq, bh = row / p.Sq, b = bh / p.q_heads, h = bh % p.q_heads;
    const std::int64_t at = p.o.at(b, h, i);
    C sum = 0;
    for (std::int64_t d = lane; d < p.Dv; d += 32) {
      sum = fma(to_compute<C>(dout[at + d]), to_compute<C>(o[at + d]), sum);
    }
    sum = warp_sum(sum);
    if (lane == 0) delta[row] = sum;
  }
}

// The tiles a backward block works on for one (b, h, query tile): the rows' key ranges, log-sum-exps and δ.
template <class C> struct QueryRows {
  std::int64_t *begin, *end;
  C *lse, *delta;

  __device__ void load(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i0, int rows, const C* log_sums,
                       const C* deltas) {
    load_ranges(p, b, i0, rows, begin, end);
    for (int r = threadIdx.x; r < rows; r += threads) {
      const std::int64_t row = i0 + r, at = (b * p.q_heads + h) * p.Sq + row;
      lse[r] = row < p.Sq ? log_sums[at] : minus_infinity<C>();
      delta[r] = row < p.Sq ? deltas[at] : C(0);
    }
  }
};

// A backward block's shared memory: the query rows, the Q and dO tiles of Br rows, the K and V tiles of Bc rows, the
// dS tile and (the dK, dV pass) the P tile, Br × Bc; backward_bytes says how much.
template <class C> struct BackwardTiles {
  QueryRows<C> rows;
  C *sQ, *sdO, *sK, *sV, *sdS, *sP;
  int Dp, Dvp, ldq, ldv, lds;

  __device__ BackwardTiles(unsigned char* shared, const Problem& p, int Br, int Bc, bool with_p)
      : Dp(padded(p.D)), Dvp(padded(p.Dv)), ldq(Dp + 1), ldv(Dvp + 1), lds(Bc + 1) {
    Carve carve{shared};
    rows.begin = carve.take<std::int64_t>(Br);
    rows.end = carve.take<std::int64_t>(Br);
    sQ = carve.take<C>(Br * ldq);
    sdO = carve.take<C>(Br * ldv);
    sK = carve.take<C>(Bc * ldq);
    sV = carve.take<C>(Bc * ldv);
    sdS = carve.take<C>(Br * lds);
    sP = with_p ? carve.take<C>(Br * lds) : nullptr;
    rows.lse = carve.take<C>(Br);
    rows.delta = carve.take<C>(Br);
  }
};

// P (with dropout's mask: P∘Z) and dS of a thread's R × K entries of queries [i0, ..) × keys [j0, ..): from the
// shared Q, K (row stride ldq), dO, V (ldv).
template <class S, int R, int K>
__device__ void probabilities(const Problem& p, const S* bias, const QueryRows<compute_of<S>>& rows,
                              const compute_of<S>* sQ, const compute_of<S>* sK, const compute_of<S>* sdO,
                              const compute_of<S>* sV, int ldq, int ldv, std::int64_t b, std::int64_t h,
                              std::int64_t i0, std::int64_t j0, compute_of<S> (&P)[R][K], compute_of<S> (&dS)[R][K]) {
  using C = compute_of<S>;
  const int ty = threadIdx.x / side, tx = threadIdx.x % side, Dp = padded(p.D), Dvp = padded(p.Dv);
  C s[R][K], dp[R][K];
  tile_dots(sQ, ldq, sK, ldq, Dp, s);
  tile_dots(sdO, ldv, sV, ldv, Dvp, dp);
  const C keep_scale = static_cast<C>(1.0 / (1.0 - p.dropout));
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int r = ty + side * i;
    const C lse = rows.lse[r];
#pragma unroll
    for (int j = 0; j < K; ++j) {
      const int c = tx + side * j;
      const C score = masked_score(p, bias, s[i][j], b, h, i0 + r, j0 + c, rows.begin[r], rows.end[r]);
      const C prob = lse == minus_infinity<C>() || score == minus_infinity<C>() ? C(0) : exp_of(score - lse);
      const C z = p.dropout == 0 ? C(1) : p.kept(b, h, i0 + r, j0 + c) ? keep_scale : C(0);
      P[i][j] = prob * z;
      dS[i][j] = prob * (dp[i][j] * z - rows.delta[r]);
    }
  }
}

template <class S, int Slots>
__global__ void __launch_bounds__(threads) attention_backward_kv_kernel(const Problem p, const S* q, const S* k,
                                                                        const S* v, const S* bias, const S* dout,
                                                                        const compute_of<S>* log_sums,
                                                                        const compute_of<S>* delta, S* dk, S* dv) {
  using C = compute_of<S>;
  constexpr int Br = Tiles<C>::kv_q, Bc = Tiles<C>::kv_k, R = Br / side, K = Bc / side, KR = Bc / side;
  wait_for_prior_kernels();
  extern __shared__ __align__(16) unsigned char shared[];
  BackwardTiles<C> t(shared, p, Br, Bc, true);
  const int Dp = t.Dp, Dvp = t.Dvp, ldq = t.ldq, ldv = t.ldv, lds = t.lds;
  QueryRows<C>& rows = t.rows;
  C *sQ = t.sQ, *sdO = t.sdO, *sK = t.sK, *sV = t.sV, *sdS = t.sdS, *sP = t.sP;

  const std::int64_t bk = blockIdx.x, b = bk / p.kv_heads, kvh = bk % p.kv_heads;
  const std::int64_t j0 = static_cast<std::int64_t>(blockIdx.y) * Bc, group = p.q_heads / p.kv_heads;
  const int tid = threadIdx.x, ty = tid / side, tx = tid % side;
  load_keys(p, sK, sV, Bc, ldq, ldv, k, v, b, kvh, j0);
  C dK[KR][Slots], dV[KR][Slots];
  set_zero(dK);
  set_zero(dV);
  for (std::int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (std::int64_t i0 = 0; i0 < p.Sq; i0 += Br) {
      __syncthreads();  // the previous tile's readers are done
      rows.load(p, b, h, i0, Br, log_sums, delta);
      __syncthreads();
      std::int64_t first, last;
      key_span(rows.begin, rows.end, Br, first, last);
      if (first >= j0 + Bc || last <= j0) continue;  // no query of the tile sees these keys (the same in every thread)
      load_tile(sQ, Br, ldq, Dp, q, p.q, b, h, i0, p.Sq, p.D);
      load_tile(sdO, Br, ldv, Dvp, dout, p.o, b, h, i0, p.Sq, p.Dv);
      __syncthreads();
      C P[R][K], dS[R][K];
      probabilities<S, R, K>(p, bias, rows, sQ, sK, sdO, sV, ldq, ldv, b, h, i0, j0, P, dS);
      store_owned(P, sP, lds);
      store_owned(dS, sdS, lds);
      __syncthreads();
      // dV[c] += Σ_r P[r][c]·dO[r], dK[c] += Σ_r dS[r][c]·Q[r], the thread's key rows c = ty + 16·i.
      for (int r = 0; r < Br; ++r) {
#pragma unroll
        for (int i = 0; i < KR; ++i) {
          const int c = ty + side * i;
          const C pc = sP[r * lds + c], dsc = sdS[r * lds + c];
#pragma unroll
          for (int j = 0; j < Slots; ++j) {
            const int d = tx + side * j;
            if (d < Dvp) dV[i][j] = fma(pc, sdO[r * ldv + d], dV[i][j]);
            if (d < Dp) dK[i][j] = fma(dsc, sQ[r * ldq + d], dK[i][j]);
          }
        }
      }
    }
  }
  store_owned_rows(dK, static_cast<C>(p.scale), dk, p.k, b, kvh, j0, p.Sk, p.D);
  store_owned_rows(dV, C(1), dv, p.v, b, kvh, j0, p.Sk, p.Dv);
}

// A block per (batch·head group, query tile): the group is the batches and heads one block of bias rows serves (one
// (b, h) without a bias gradient or for a full bias).
template <class S, int Slots>
__global__ void __launch_bounds__(threads) attention_backward_q_kernel(const Problem p, const S* q, const S* k,
                                                                       const S* v, const S* bias, const S* dout,
                                                                       const compute_of<S>* log_sums,
                                                                       const compute_of<S>* delta, S* dq,
                                                                       compute_of<S>* dbias, std::int64_t bias_batches,
                                                                       std::int64_t bias_heads) {
  using C = compute_of<S>;
  constexpr int Br = Tiles<C>::q_q, Bc = Tiles<C>::q_k, R = Br / side, K = Bc / side;
  wait_for_prior_kernels();
  extern __shared__ __align__(16) unsigned char shared[];
  BackwardTiles<C> t(shared, p, Br, Bc, false);
  const int Dp = t.Dp, Dvp = t.Dvp, ldq = t.ldq, ldv = t.ldv, lds = t.lds;
  QueryRows<C>& rows = t.rows;
  C *sQ = t.sQ, *sdO = t.sdO, *sK = t.sK, *sV = t.sV, *sdS = t.sdS;

  const std::int64_t g = blockIdx.x, gb = g / bias_heads, gh = g % bias_heads;
  const std::int64_t i0 = static_cast<std::int64_t>(blockIdx.y) * Br;
  const int tid = threadIdx.x, ty = tid / side, tx = tid % side;
  for (std::int64_t b = gb; b < p.batch; b += bias_batches) {
    for (std::int64_t h = gh; h < p.q_heads; h += bias_heads) {
      __syncthreads();  // the previous head's readers are done
      rows.load(p, b, h, i0, Br, log_sums, delta);
      load_tile(sQ, Br, ldq, Dp, q, p.q, b, h, i0, p.Sq, p.D);
      load_tile(sdO, Br, ldv, Dvp, dout, p.o, b, h, i0, p.Sq, p.Dv);
      __syncthreads();
      std::int64_t first, last;
      key_span(rows.begin, rows.end, Br, first, last);
      C dQ[R][Slots];
      set_zero(dQ);
      for (std::int64_t j0 = first; j0 < last; j0 += Bc) {
        load_keys(p, sK, sV, Bc, ldq, ldv, k, v, b, p.kv_head(h), j0);
        __syncthreads();
        C P[R][K], dS[R][K];
        probabilities<S, R, K>(p, bias, rows, sQ, sK, sdO, sV, ldq, ldv, b, h, i0, j0, P, dS);
        store_owned(dS, sdS, lds);
        if (dbias) {
#pragma unroll
          for (int i = 0; i < R; ++i) {
            const std::int64_t row = i0 + ty + side * i;
#pragma unroll
            for (int j = 0; j < K; ++j) {
              const std::int64_t col = j0 + tx + side * j;
              if (row < p.Sq && col < p.Sk) dbias[p.bias_at(b, h, row) + col] += dS[i][j];
            }
          }
        }
        __syncthreads();
        for (int c = 0; c < Bc; ++c) {
#pragma unroll
          for (int i = 0; i < R; ++i) {
            const C dsc = sdS[(ty + side * i) * lds + c];
#pragma unroll
            for (int j = 0; j < Slots; ++j) {
              const int d = tx + side * j;
              if (d < Dp) dQ[i][j] = fma(dsc, sK[c * ldq + d], dQ[i][j]);
            }
          }
        }
        __syncthreads();  // the next tile overwrites sK, sV and sdS
      }
      store_owned_rows(dQ, static_cast<C>(p.scale), dq, p.q, b, h, i0, p.Sq, p.D);
    }
  }
}

// Calls fn(std::integral_constant<int, Slots>) with the register slots a head size needs (16 columns each).
template <class Fn> void dispatch_slots(std::int64_t width, Fn&& fn) {
  if (width <= 64) return fn(std::integral_constant<int, 4>{});
  if (width <= 128) return fn(std::integral_constant<int, 8>{});
  return fn(std::integral_constant<int, 16>{});
}

// Bytes of shared memory of the forward: two int64 range arrays and three C arrays of Br rows, the Q tile, the K and
// V tiles of Bc rows, one Br × Bc score tile.
template <class C> std::size_t forward_bytes(const Problem& p, int Br, int Bc) {
  const std::int64_t ldq = padded(p.D) + 1, ldv = padded(p.Dv) + 1;
  const std::int64_t elements = Br * ldq + Bc * (ldq + ldv) + Br * (Bc + 1) + 3 * Br;
  return static_cast<std::size_t>(2 * Br * sizeof(std::int64_t) + elements * sizeof(C));
}
// Of a backward pass: the range arrays and two C arrays of Br rows, Q and dO tiles of Br rows, K and V tiles of Bc
// rows, `score_tiles` Br × Bc tiles.
template <class C> std::size_t backward_bytes(const Problem& p, int Br, int Bc, int score_tiles) {
  const std::int64_t ldq = padded(p.D) + 1, ldv = padded(p.Dv) + 1;
  const std::int64_t elements = (Br + Bc) * (ldq + ldv) + score_tiles * Br * (Bc + 1) + 2 * Br;
  return static_cast<std::size_t>(2 * Br * sizeof(std::int64_t) + elements * sizeof(C));
}

template <class Kernel> void allow_shared(Kernel kernel, std::size_t bytes) {
  TAPEGRAD_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

unsigned tiles_of(std::int64_t n, int tile) { return static_cast<unsigned>((n + tile - 1) / tile); }

void check_problem(const Problem& p) {
  check(p.D <= attention_max_head_dim && p.Dv <= attention_max_head_dim, "dot_product_attention",
        "head sizes ", p.D, " (q, k) and ", p.Dv, " (v) exceed the GPU kernels' ", attention_max_head_dim);
  // A grid's y axis counts tiles (at least 16 queries and 32 keys each) up to 65535.
  check(p.Sq <= 65535LL * 16 && p.Sk <= 65535LL * 32, "dot_product_attention", "sequences of ", p.Sq,
        " queries and ", p.Sk, " keys exceed the GPU kernels' grid");
}

std::atomic<AttentionKernels> chosen_kernels{AttentionKernels::cudnn_where_it_applies};
std::atomic<bool> attention_autotune_enabled{false};

bool cudnn_allowed() { return attention_kernels() == AttentionKernels::cudnn_where_it_applies; }

}  // namespace

void set_attention_kernels(AttentionKernels kernels) { chosen_kernels.store(kernels, std::memory_order_relaxed); }
AttentionKernels attention_kernels() { return chosen_kernels.load(std::memory_order_relaxed); }
void set_attention_autotune(bool enable) { attention_autotune_enabled.store(enable, std::memory_order_relaxed); }
bool attention_autotune() { return attention_autotune_enabled.load(std::memory_order_relaxed); }

void attention_lengths_int32(const Problem& p, std::int32_t* queries, std::int32_t* keys, int device) {
  if (p.batch == 0) return;
  const Launch launch(device);
  attention_lengths_kernel<<<launch.blocks_for(p.batch, threads), threads, 0, launch.stream()>>>(p, queries, keys);
  TAPEGRAD_CUDA_CHECK_LAUNCH();
}

void attention_clear_padding(DType dtype, const Problem& p, void* t, const RowStrides& r, std::int64_t heads,
                             std::int64_t width, bool queries, void* log_sums, int device) {
  const std::int64_t n = p.batch * heads * (queries ? p.Sq : p.Sk) * width;
  if (n == 0) return;
  const Launch launch(device);
  dispatch_float(dtype, "dot_product_attention", [&](auto unit) {
    using S = decltype(unit);
    attention_clear_padding_kernel<S><<<launch.blocks_for(n, threads), threads, 0, launch.stream()>>>(
        p, static_cast<S*>(t), r, heads, width, queries, static_cast<compute_of<S>*>(log_sums));
  });
  TAPEGRAD_CUDA_CHECK_LAUNCH();
}

void attention_forward(DType dtype, const Problem& p, const void* q, const void* k, const void* v, const void* bias,
                       void* o, void* log_sums, int device) {
  check_problem(p);
  if (p.batch * p.q_heads * p.Sq == 0) return;
  if (cudnn_allowed() && cudnn_attention_forward(dtype, p, q, k, v, o, log_sums, device)) return;
  Launch launch(device);
  dispatch_float(dtype, "dot_product_attention", [&](auto unit) {
    using S = decltype(unit);
    using C = compute_of<S>;
    const std::size_t bytes = forward_bytes<C>(p, Tiles<C>::forward_q, Tiles<C>::forward_k);
    dispatch_slots(padded(p.Dv), [&](auto slots) {
      const auto kernel = attention_forward_kernel<S, slots()>;
      allow_shared(kernel, bytes);
      launch_overlapped(launch, kernel,
                        dim3(static_cast<unsigned>(p.batch * p.q_heads), tiles_of(p.Sq, Tiles<C>::forward_q)), threads,
                        bytes, p, static_cast<const S*>(q), static_cast<const S*>(k),
                        static_cast<const S*>(v), static_cast<const S*>(bias), static_cast<S*>(o),
                        static_cast<C*>(log_sums));
    });
  });
}

void attention_backward(DType dtype, const Problem& p, const void* q, const void* k, const void* v, const void* bias,
                        const void* o, const void* log_sums, const void* dout, void* delta, void* dq, void* dk,
                        void* dv, void* dbias, int device) {
  check_problem(p);
  if (p.batch * p.q_heads == 0) return;
  if (cudnn_allowed() && cudnn_attention_backward(dtype, p, q, k, v, o, log_sums, dout, delta, dq, dk, dv, device)) {
    return;
  }
  Launch launch(device);
  dispatch_float(dtype, "dot_product_attention", [&](auto unit) {
    using S = decltype(unit);
    using C = compute_of<S>;
    const auto* qs = static_cast<const S*>(q);
    const auto* ks = static_cast<const S*>(k);
    const auto* vs = static_cast<const S*>(v);
    const auto* bs = static_cast<const S*>(bias);
    const auto* dos = static_cast<const S*>(dout);
    const auto* lse = static_cast<const C*>(log_sums);
    auto* deltas = static_cast<C*>(delta);
    const std::int64_t rows = p.batch * p.q_heads * p.Sq;
    if (rows > 0) {
      launch_overlapped(launch, attention_delta_kernel<S>,
                        static_cast<unsigned>(launch.blocks_for(rows * 32, threads)), threads, 0, p,
                        static_cast<const S*>(o), dos, deltas);
    }
    dispatch_slots(std::max(padded(p.D), padded(p.Dv)), [&](auto slots) {
      if (p.Sk > 0) {
        const std::size_t bytes = backward_bytes<C>(p, Tiles<C>::kv_q, Tiles<C>::kv_k, 2);
        const auto kernel = attention_backward_kv_kernel<S, slots()>;
        allow_shared(kernel, bytes);
        launch_overlapped(launch, kernel,
                          dim3(static_cast<unsigned>(p.batch * p.kv_heads), tiles_of(p.Sk, Tiles<C>::kv_k)), threads,
                          bytes, p, qs, ks, vs, bs, dos, lse, static_cast<const C*>(deltas), static_cast<S*>(dk),
                          static_cast<S*>(dv));
      }
      if (p.Sq > 0) {
        const std::int64_t bias_batches = dbias && p.bias_batch == 0 ? 1 : p.batch;
        const std::int64_t bias_heads = dbias && p.bias_head == 0 ? 1 : p.q_heads;
        const std::size_t bytes = backward_bytes<C>(p, Tiles<C>::q_q, Tiles<C>::q_k, 1);
        const auto kernel = attention_backward_q_kernel<S, slots()>;
        allow_shared(kernel, bytes);
        launch_overlapped(launch, kernel,
                          dim3(static_cast<unsigned>(bias_batches * bias_heads), tiles_of(p.Sq, Tiles<C>::q_q)),
                          threads, bytes, p, qs, ks, vs, bs, dos, lse, static_cast<const C*>(deltas),
                          static_cast<S*>(dq), static_cast<C*>(dbias), bias_batches, bias_heads);
      }
    });
  });
}

}  // namespace tapegrad::cuda

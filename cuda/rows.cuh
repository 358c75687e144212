// What the row kernels (norm, softmax, cross_entropy) share: a row is n contiguous elements, handled by a row
// group of threads that reduce over it together, and read in packs.
//
// Row groups: a warp per row when rows are short (n <= warp_row_limit), with several rows per block; the whole
// block per row otherwise. Their reductions (sum, max) combine each thread's partial in a fixed tree, so a row gives
// the same bits on every run, and every thread of the group receives the same bits.
//
// Packs: 16 bytes at a time (4 f32, 2 f64, 8 bf16/f16) where every row start is 16-byte aligned, i.e. where all
// pointers are aligned and n (or the distance between rows, where rows are padded) is a multiple of the pack; one
// element at a time otherwise. Thread `lane` of a group handles packs lane, lane + threads, ... of its row.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "tapegrad/tensor/gpu/detail/launch.cuh"

namespace tapegrad::cuda::rows {

// ---- math in the compute type C (f32 or f64), IEEE-accurate (no fast-math intrinsics) ----------------------------

template <class C> __device__ __forceinline__ C exp_of(C v) {
  if constexpr (std::is_same_v<C, float>) return expf(v);
  else return exp(v);
}
template <class C> __device__ __forceinline__ C log_of(C v) {
  if constexpr (std::is_same_v<C, float>) return logf(v);
  else return log(v);
}
template <class C> __device__ __forceinline__ C sqrt_of(C v) {
  if constexpr (std::is_same_v<C, float>) return sqrtf(v);
  else return sqrt(v);
}
template <class C> __device__ __forceinline__ C infinity_of() {
  if constexpr (std::is_same_v<C, float>) return __int_as_float(0x7f800000);
  else return __longlong_as_double(0x7ff0000000000000LL);
}

// Two values reduced together, in one pass of shuffles and barriers (the norm backward's two row means).
template <class C> struct Pair {
  C first, second;
};

struct Sum {
  template <class C> __device__ __forceinline__ C operator()(C a, C b) const { return a + b; }
  template <class C> __device__ __forceinline__ Pair<C> operator()(Pair<C> a, Pair<C> b) const {
    return {a.first + b.first, a.second + b.second};
  }
};
// fmax: a NaN element is skipped, as the CPU's running std::max(max, x) skips it.
struct Max {
  template <class C> __device__ __forceinline__ C operator()(C a, C b) const {
    if constexpr (std::is_same_v<C, float>) return fmaxf(a, b);
    else return fmax(a, b);
  }
};

// ---- row groups ---------------------------------------------------------------------------------------------------

constexpr unsigned full_warp = 0xffffffffu;

template <class C> __device__ __forceinline__ C shuffle_xor(C v, int offset) {
  return __shfl_xor_sync(full_warp, v, offset);
}
template <class C> __device__ __forceinline__ Pair<C> shuffle_xor(Pair<C> v, int offset) {
  return {shuffle_xor(v.first, offset), shuffle_xor(v.second, offset)};
}
constexpr std::int64_t warp_row_limit = 1024;  // longer rows get a whole block
constexpr int block_row_threads = 512;

// The threads of one row: a warp (Threads == 32, `rows_per_block` rows per block) or the whole block.
template <int Threads> struct RowGroup {
  static_assert(Threads % 32 == 0 && Threads <= 1024);
  static constexpr int threads = Threads;
  static constexpr int rows_per_block = Threads == 32 ? 8 : 1;
  static constexpr int block_threads = Threads * rows_per_block;

  __device__ static int lane() { return static_cast<int>(threadIdx.x) % Threads; }
  // This group's first row, and the distance to its next one in a grid-stride loop over rows.
  __device__ static std::int64_t first_row() {
    return std::int64_t{blockIdx.x} * rows_per_block + threadIdx.x / Threads;
  }
  __device__ static std::int64_t row_stride() { return std::int64_t{gridDim.x} * rows_per_block; }

  // op over every thread's v, the same bits in each thread. In block mode every thread of the block must call it:
  // it synchronizes the block.
  template <class C, class Op> __device__ static C reduce(C v, Op op) {
    for (int offset = 16; offset > 0; offset /= 2) v = op(v, shuffle_xor(v, offset));
    if constexpr (Threads > 32) {
      constexpr int warps = Threads / 32;
      __shared__ C warp_results[warps];
      __syncthreads();  // every thread has read the results of the previous call
      if (threadIdx.x % 32 == 0) warp_results[threadIdx.x / 32] = v;
      __syncthreads();
      v = warp_results[0];
      for (int w = 1; w < warps; ++w) v = op(v, warp_results[w]);
    }
    return v;
  }
};

// ---- packs --------------------------------------------------------------------------------------------------------

// The V elements of pack p of `row`, in C.
template <int V, class S, class C> __device__ __forceinline__ void load(const S* row, std::int64_t p, C (&out)[V]) {
  const Pack<S, V> pack = reinterpret_cast<const Pack<S, V>*>(row)[p];
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = to_compute<C>(pack.v[k]);
}
// Pack p of `row` = values, each rounded to S.
template <int V, class S, class C> __device__ __forceinline__ void store(S* row, std::int64_t p, const C (&values)[V]) {
  Pack<S, V> pack;
#pragma unroll
  for (int k = 0; k < V; ++k) pack.v[k] = from_compute<S>(values[k]);
  reinterpret_cast<Pack<S, V>*>(row)[p] = pack;
}

// Rows of `hidden` elements stored `ld` apart, read and written in packs up to ld. Padded: ld > hidden, and the
// elements past hidden (whatever they hold) must count as zeros; otherwise every check below folds away at compile
// time and the loads are the plain ones.
template <int V, bool Padded> struct RowExtent {
  std::int64_t hidden;

  // How many elements of pack q are the row's: V, except in the last packs of a padded row. One 64-bit subtraction
  // per pack, and 32-bit comparisons per element (a 64-bit one per element made padded rows' kernels
  // instruction-bound: the norm backward at hidden 1021 issued 1.5 times the instructions of hidden 1024).
  __device__ __forceinline__ int in_pack(std::int64_t q) const {
    if constexpr (!Padded) return V;
    const std::int64_t left = hidden - q * V;
    return left >= V ? V : left > 0 ? static_cast<int>(left) : 0;
  }
  // Whether element k of pack q is one of the row's.
  __device__ __forceinline__ bool in_row(std::int64_t q, int k) const { return k < in_pack(q); }
  // Pack q of a stored row (every pack up to ld can be read), its elements past hidden as 0.
  template <class S, class C> __device__ __forceinline__ void load(const S* row, std::int64_t q, C (&out)[V]) const {
    rows::load(row, q, out);
    const int n = in_pack(q);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (k >= n) out[k] = C(0);
    }
  }
  // Pack q of a vector of exactly `hidden` elements (γ, β), which may end inside the pack or before it: zeros past
  // the end, where nothing is read.
  template <class S, class C>
  __device__ __forceinline__ void load_vector(const S* vector, std::int64_t q, C (&out)[V]) const {
    if constexpr (Padded) {
      if ((q + 1) * V > hidden) {
        const int n = in_pack(q);
#pragma unroll
        for (int k = 0; k < V; ++k) out[k] = k < n ? to_compute<C>(vector[q * V + k]) : C(0);
        return;
      }
    }
    rows::load(vector, q, out);
  }
};

// Calls fn(std::bool_constant<padded>{}).
template <class Fn> void dispatch_padded(bool padded, Fn&& fn) {
  if (padded) fn(std::true_type{});
  else fn(std::false_type{});
}

// The elements of a 16-byte pack of S.
template <class S> constexpr int wide_pack = static_cast<int>(16 / sizeof(S));

// Whether rows of n elements at each of `pointers` (null ones ignored) can be read in 16-byte packs.
template <class S> bool packs_fit(std::int64_t n, std::initializer_list<const void*> pointers) {
  if (n % wide_pack<S> != 0) return false;
  for (const void* p : pointers) {
    if (!aligned_16(p)) return false;
  }
  return true;
}

// A row kernel's compile-time shape: the row group, and the pack width V; with the loops of a row kernel.
template <int V_, int Threads> struct RowConfig : RowGroup<Threads> {
  static constexpr int V = V_;

  // Calls body(r) for each row of this thread's group: a grid-stride loop over `rows` rows.
  template <class Body> __device__ static void for_each_row(std::int64_t rows, Body&& body) {
    for (std::int64_t r = RowConfig::first_row(); r < rows; r += RowConfig::row_stride()) body(r);
  }
  // Calls body(q) for each pack q of a row of n elements that this thread handles.
  template <class Body> __device__ static void for_each_pack(std::int64_t n, Body&& body) {
    for (std::int64_t q = RowConfig::lane(); q < n / V; q += Threads) body(q);
  }
};

// Calls fn(RowConfig<V, Threads>{}) for rows of n elements of S: 16-byte packs when `wide`, a warp or a block per row.
template <class S, class Fn> void dispatch_rows(std::int64_t n, bool wide, Fn&& fn) {
  constexpr int W = wide_pack<S>;
  const bool warp = n <= warp_row_limit;
  if (wide) {
    if (warp) fn(RowConfig<W, 32>{});
    else fn(RowConfig<W, block_row_threads>{});
  } else {
    if (warp) fn(RowConfig<1, 32>{});
    else fn(RowConfig<1, block_row_threads>{});
  }
}

// Blocks for a grid-stride loop of row groups over `rows` rows.
template <class Config> int row_blocks(const Launch& launch, std::int64_t rows) {
  return launch.blocks_for(rows * Config::threads, Config::block_threads);
}

}  // namespace tapegrad::cuda::rows

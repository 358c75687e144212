// Reductions on the GPU. The host merges x's axes into alternating kept and reduced groups (size-1 axes dropped);
// output o then sits at kept.offset(o) in x, and its reduced element j at reduced.offset(j / row) + j % row, where
// `row` is the innermost reduced group's length when that group is x's innermost axis and is read as contiguous
// rows, else 1. Two kernels:
//   - rows (the innermost axis is reduced, in rows of at least 128): a block per output, its threads striding
//     along the contiguous rows, then a cub::BlockReduce;
//   - columns (every other case): a thread per output walking its reduced elements in order; when the innermost
//     axis is kept, neighbouring threads read neighbouring elements.
// When there are few outputs for many reduced elements, each output's elements are cut into chunks, each reduced
// into a partial; a second pass folds each output's partials (8 fixed slices of the chunks, each in chunk order,
// then the slices in order). The chunking depends only on the dims, and every thread and block folds its elements
// in a fixed order, so results are bitwise the same on every run.
// Accumulators: sums in f64 for f32/f64 and f32 for bf16/f16, as on the CPU. max carries (value, flat index into
// x) pairs and keeps the greater value, a NaN over any number, and on ties the lower index: an order-free choice,
// so the first maximum in row-major order wins whatever the order of folding.
#include "tapegrad/cuda/reduce.hpp"

#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "tapegrad/cuda/elementwise.hpp"
#include "tapegrad/tensor/gpu/detail/launch.cuh"

namespace tapegrad::cuda {

namespace {

constexpr int max_axes = 8;
constexpr int max_groups = max_axes / 2;  // groups alternate between kept and reduced

// A row-major index space over some groups of x's axes, with x's stride of each.
struct Space {
  int rank = 0;
  std::int64_t dim[max_groups]{}, stride[max_groups]{};

  __device__ std::int64_t offset(std::int64_t i) const {
    std::int64_t off = 0;
#pragma unroll
    for (int a = max_groups - 1; a >= 0; --a) {
      if (a >= rank) continue;
      off += i % dim[a] * stride[a];
      i /= dim[a];
    }
    return off;
  }
};

// Steps through a Space in row-major order from index `i`, keeping the offset current.
class Cursor {
 public:
  __device__ Cursor(const Space& space, std::int64_t i) : space_(space) {
#pragma unroll
    for (int a = max_groups - 1; a >= 0; --a) {
      if (a >= space.rank) continue;
      index_[a] = i % space.dim[a];
      i /= space.dim[a];
      offset_ += index_[a] * space.stride[a];
    }
  }
  __device__ std::int64_t offset() const { return offset_; }
  __device__ void next() {
#pragma unroll
    for (int a = max_groups - 1; a >= 0; --a) {
      if (a >= space_.rank) continue;
      offset_ += space_.stride[a];
      if (++index_[a] < space_.dim[a]) return;
      offset_ -= space_.dim[a] * space_.stride[a];
      index_[a] = 0;
    }
  }

 private:
  const Space& space_;
  std::int64_t index_[max_groups]{};
  std::int64_t offset_ = 0;
};

struct Plan {
  Space kept, reduced;
  std::int64_t row = 1;                // reduced element j is at reduced.offset(j / row) + j % row
  std::int64_t outputs = 0, count = 0;  // outputs, and reduced elements of each
  std::int64_t chunks = 1, chunk = 1;   // each output's elements in `chunks` pieces of `chunk` (the last shorter)
  bool rows = false;                    // reduce with the rows kernel
};

// Minimum innermost reduced length for the rows kernel; below it a block per output would leave most threads idle.
constexpr std::int64_t min_row = 128;
// Chunking targets: enough blocks or threads to fill a large GPU, with enough elements in each chunk that the
// partials stay a small fraction of the traffic.
constexpr std::int64_t rows_target_blocks = 1024, rows_min_chunk = 4096;
// Columns: each thread's loads stride through memory one row apart, so hiding their latency takes many threads
// (2^18: ~16 warps per SM on an H200; 2^16 left a [8192, 4096] bf16 sum at 0.28 TB/s) and short chunks (a chunk
// of 64 rows took 32 µs on [256, 256]: its loads wait on DRAM one after another).
constexpr std::int64_t columns_target_threads = 1 << 18, columns_min_chunk = 32;

Space space_of(const std::vector<std::int64_t>& dims, const std::vector<std::int64_t>& strides) {
  Space s;
  s.rank = static_cast<int>(dims.size());
  std::copy(dims.begin(), dims.end(), s.dim);
  std::copy(strides.begin(), strides.end(), s.stride);
  return s;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

Plan plan(const Reduction& r, const char* op) {
  const std::size_t rank = r.dims.size();
  check(rank <= static_cast<std::size_t>(max_axes) && r.reduced.size() == rank, op, "a reduction of rank ", rank,
        " with ", r.reduced.size(), " axis flags (at most ", max_axes, " axes, one flag each)");
  // Groups from the innermost axis out: neighbours (size-1 axes aside) that are alike merge.
  struct Group {
    std::int64_t dim, stride;
    bool reduced;
  };
  std::vector<Group> groups;
  std::int64_t stride = 1;
  for (std::size_t a = rank; a-- > 0;) {
    if (r.dims[a] == 1) continue;
    if (!groups.empty() && groups.back().reduced == r.reduced[a]) groups.back().dim *= r.dims[a];
    else groups.push_back({r.dims[a], stride, r.reduced[a]});
    stride *= r.dims[a];
  }
  std::reverse(groups.begin(), groups.end());

  Plan p;
  std::vector<std::int64_t> kept_dims, kept_strides, reduced_dims, reduced_strides;
  for (const Group& g : groups) {
    (g.reduced ? reduced_dims : kept_dims).push_back(g.dim);
    (g.reduced ? reduced_strides : kept_strides).push_back(g.stride);
  }
  p.outputs = 1;
  for (std::int64_t d : kept_dims) p.outputs *= d;
  p.count = 1;
  for (std::int64_t d : reduced_dims) p.count *= d;
  p.kept = space_of(kept_dims, kept_strides);
  // Nothing to write, or nothing to read (every output is then the identity; `reduced` stays empty).
  if (p.outputs == 0 || p.count == 0) return p;

  p.rows = !groups.empty() && groups.back().reduced && groups.back().dim >= min_row;
  if (p.rows) {
    p.row = reduced_dims.back();
    reduced_dims.pop_back();
    reduced_strides.pop_back();
  }
  p.reduced = space_of(reduced_dims, reduced_strides);
  const std::int64_t wanted = p.rows ? ceil_div(rows_target_blocks, p.outputs) : ceil_div(columns_target_threads, p.outputs);
  const std::int64_t most = ceil_div(p.count, p.rows ? rows_min_chunk : columns_min_chunk);
  p.chunk = ceil_div(p.count, std::max<std::int64_t>(1, std::min(wanted, most)));
  p.chunks = ceil_div(p.count, p.chunk);  // every chunk non-empty
  return p;
}

// ---- what is reduced ------------------------------------------------------------------------------------------

// Sums accumulate in f64 for f32/f64 and in f32 for the 16-bit types, and round once to Y (S, or a wide output).
template <class S, class Y = S> struct Sum {
  using Acc = std::conditional_t<sizeof(S) == 2, float, double>;
  const S* x;
  Y* y;
  Acc divisor;

  __device__ Acc identity() const { return Acc(0); }
  __device__ Acc load(std::int64_t at) const { return to_compute<Acc>(x[at]); }
  __device__ static Acc combine(Acc a, Acc b) { return a + b; }
  __device__ void finish(std::int64_t o, Acc total) const { y[o] = from_compute<Y>(total / divisor); }
};

template <class S> struct Max {
  using C = compute_of<S>;
  struct Acc {
    C value;
    std::int64_t at;  // flat index into x
  };
  const S* x;
  S* y;
  std::int64_t* argmax;

  // Loses to every element (an element of value -inf has a lower index).
  static constexpr std::int64_t nowhere = std::numeric_limits<std::int64_t>::max();
  __device__ Acc identity() const { return {static_cast<C>(-INFINITY), nowhere}; }
  __device__ Acc load(std::int64_t at) const { return {to_compute<C>(x[at]), at}; }
  __device__ static Acc combine(const Acc& a, const Acc& b) {
    const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
    if (a_nan != b_nan) return a_nan ? a : b;
    if (!a_nan && a.value != b.value) return a.value > b.value ? a : b;
    return a.at <= b.at ? a : b;
  }
  __device__ void finish(std::int64_t o, const Acc& best) const {
    y[o] = x[best.at];  // the element itself: its bits, NaN payload included
    argmax[o] = best.at;
  }
};

template <class Op> struct Combine {
  __device__ typename Op::Acc operator()(const typename Op::Acc& a, const typename Op::Acc& b) const {
    return Op::combine(a, b);
  }
};

// ---- kernels ---------------------------------------------------------------------------------------------------

// Where a result goes: the output itself, or with several chunks the partial of (chunk, output).
template <class Op>
__device__ void store(const Op& op, const Plan& p, std::int64_t o, std::int64_t c, typename Op::Acc acc,
                      typename Op::Acc* partial) {
  if (p.chunks == 1) op.finish(o, acc);
  else partial[c * p.outputs + o] = acc;
}

template <class Op, int threads> __global__ void reduce_rows_kernel(Op op, Plan p, typename Op::Acc* partial) {
  wait_for_prior_kernels();
  using Acc = typename Op::Acc;
  using BlockReduce = cub::BlockReduce<Acc, threads>;
  __shared__ typename BlockReduce::TempStorage storage;
  for (std::int64_t b = blockIdx.x; b < p.outputs * p.chunks; b += gridDim.x) {
    const std::int64_t o = b % p.outputs, c = b / p.outputs;
    const std::int64_t base = p.kept.offset(o), end = min(p.count, (c + 1) * p.chunk);
    std::int64_t j = c * p.chunk + threadIdx.x;
    std::int64_t row = j / p.row, col = j % p.row;
    std::int64_t row_offset = p.reduced.offset(row);
    Acc acc = op.identity();
    for (; j < end; j += threads) {
      acc = Op::combine(acc, op.load(base + row_offset + col));
      col += threads;
      if (col >= p.row) {
        row += col / p.row;
        col %= p.row;
        row_offset = p.reduced.offset(row);
      }
    }
    const Acc total = BlockReduce(storage).Reduce(acc, Combine<Op>{});
    if (threadIdx.x == 0) store(op, p, o, c, total, partial);
    __syncthreads();  // the next output's reduction reuses `storage`
  }
}

// acc combined with load(0), ..., load(count - 1) in that order, with eight loads in flight: a thread whose loads
// each waited for the one before left a column sum's folds latency-bound (db2's second pass took 17 µs on 128
// partials of 1024 columns).
template <class Op, class Load>
__device__ typename Op::Acc fold_in_order(typename Op::Acc acc, std::int64_t count, const Load& load) {
  constexpr int ahead = 8;
  std::int64_t k = 0;
  for (; k + ahead <= count; k += ahead) {
    typename Op::Acc v[ahead];
#pragma unroll
    for (int i = 0; i < ahead; ++i) v[i] = load(k + i);
#pragma unroll
    for (int i = 0; i < ahead; ++i) acc = Op::combine(acc, v[i]);
  }
  for (; k < count; ++k) acc = Op::combine(acc, load(k));
  return acc;
}

template <class Op> __global__ void reduce_columns_kernel(Op op, Plan p, typename Op::Acc* partial) {
  wait_for_prior_kernels();
  for (std::int64_t t = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; t < p.outputs * p.chunks;
       t += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t o = t % p.outputs, c = t / p.outputs;
    const std::int64_t base = p.kept.offset(o), begin = c * p.chunk, end = min(p.count, begin + p.chunk);
    typename Op::Acc acc = op.identity();
    if (p.reduced.rank == 1) {  // one stride: the same order as the general walk below
      const std::int64_t stride = p.reduced.stride[0], first = base + begin * stride;
      acc = fold_in_order<Op>(acc, end - begin, [&](std::int64_t k) { return op.load(first + k * stride); });
    } else if (begin < end) {
      Cursor at(p.reduced, begin);
      for (std::int64_t j = begin; j < end; ++j, at.next()) acc = Op::combine(acc, op.load(base + at.offset()));
    }
    store(op, p, o, c, acc, partial);
  }
}

// Folds each output's partials: a block takes 32 outputs at a time, each of its 8 warps one fixed slice of the
// chunks (in chunk order, neighbouring threads on neighbouring outputs: coalesced), then the slices are combined in
// order. A thread per output folding every chunk left db2's second pass latency-bound (10 µs on 128 chunks of 1024
// outputs, 4 blocks on a 132-SM GPU).
constexpr int finish_columns = 32, finish_slices = 8;

template <class Op>
__global__ void __launch_bounds__(finish_columns * finish_slices)
    finish_kernel(Op op, Plan p, const typename Op::Acc* partial) {
  wait_for_prior_kernels();
  using Acc = typename Op::Acc;
  __shared__ Acc slice_accs[finish_slices][finish_columns];
  const int column = static_cast<int>(threadIdx.x) % finish_columns;
  const int slice = static_cast<int>(threadIdx.x) / finish_columns;
  const std::int64_t begin = p.chunks * slice / finish_slices, end = p.chunks * (slice + 1) / finish_slices;
  for (std::int64_t tile = blockIdx.x; tile * finish_columns < p.outputs; tile += gridDim.x) {  // same for the block
    const std::int64_t o = tile * finish_columns + column;
    Acc acc = op.identity();
    if (o < p.outputs) {
      acc = fold_in_order<Op>(acc, end - begin, [&](std::int64_t k) { return partial[(begin + k) * p.outputs + o]; });
    }
    slice_accs[slice][column] = acc;
    __syncthreads();
    if (slice == 0 && o < p.outputs) {
      Acc total = slice_accs[0][column];
      for (int s = 1; s < finish_slices; ++s) total = Op::combine(total, slice_accs[s][column]);
      op.finish(o, total);
    }
    __syncthreads();  // the slice results are read before the next tile overwrites them
  }
}

template <class Op> void reduce(const Op& op, const Plan& p, int device) {
  if (p.outputs == 0) return;
  using Acc = typename Op::Acc;
  Launch launch(device);
  const bool chunked = p.chunks > 1;
  Scratch scratch(chunked ? static_cast<std::size_t>(p.outputs * p.chunks) * sizeof(Acc) : 0, device);
  Acc* partial = static_cast<Acc*>(scratch.data());
  constexpr int threads = 256;
  if (p.rows) {
    launch_overlapped(launch, reduce_rows_kernel<Op, threads>,
                      launch.blocks_for(p.outputs * p.chunks * threads, threads), threads, 0, op, p, partial);
  } else {
    launch_overlapped(launch, reduce_columns_kernel<Op>, launch.blocks_for(p.outputs * p.chunks, threads), threads,
                      0, op, p, partial);
  }
  if (chunked) {
    constexpr int finish_threads = finish_columns * finish_slices;
    launch_overlapped(launch, finish_kernel<Op>, launch.blocks_for(p.outputs * finish_slices, finish_threads),
                      finish_threads, 0, op, p, partial);
  }
}

template <class S> __global__ void scatter_kernel(const S* dy, const std::int64_t* argmax, std::int64_t n, S* dx) {
  for (std::int64_t o = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; o < n;
       o += std::int64_t{gridDim.x} * blockDim.x) {
    dx[argmax[o]] = dy[o];
  }
}

}  // namespace

void sum(DType dtype, const void* x, const Reduction& r, double divisor, void* y, int device, bool wide_output) {
  const Plan p = plan(r, "sum");
  dispatch_float(dtype, "sum", [&](auto tag) {
    using S = decltype(tag);
    const auto run = [&](auto out) {
      using Y = decltype(out);
      using Op = Sum<S, Y>;
      reduce(Op{static_cast<const S*>(x), static_cast<Y*>(y), static_cast<typename Op::Acc>(divisor)}, p, device);
    };
    if (wide_output && sizeof(S) == 2) run(compute_of<S>{});
    else run(S{});
  });
}

void max(DType dtype, const void* x, const Reduction& r, void* y, std::int64_t* argmax, int device) {
  const Plan p = plan(r, "max");
  check(p.count > 0 || p.outputs == 0, "max", "cannot take the maximum over zero elements");
  dispatch_float(dtype, "max", [&](auto tag) {
    using S = decltype(tag);
    reduce(Max<S>{static_cast<const S*>(x), static_cast<S*>(y), argmax}, p, device);
  });
}

void scatter_to_argmax(DType dtype, const void* dy, const std::int64_t* argmax, std::int64_t outputs, void* dx,
                       int device) {
  if (outputs == 0) return;
  Launch launch(device);
  dispatch_float(dtype, "max", [&](auto tag) {
    using S = decltype(tag);
    constexpr int threads = 256;
    scatter_kernel<S><<<launch.blocks_for(outputs, threads), threads, 0, launch.stream()>>>(
        static_cast<const S*>(dy), argmax, outputs, static_cast<S*>(dx));
    TAPEGRAD_CUDA_CHECK_LAUNCH();
  });
}

// An elementwise program over contiguous x and y: the divisor is a constant, rounded to the compute type as the
// CPU's C(divisor).
void divide(DType dtype, const void* x, double divisor, void* y, std::int64_t n, int device) {
  const ElementProgram program{.size = 4,
                               .code = {{ElementOp::input, 0, 0, 0, 0.0},
                                        {ElementOp::constant, 1, 0, 0, divisor},
                                        {ElementOp::div, 0, 0, 1, 0.0},
                                        {ElementOp::store, 0, 0, 0, 0.0}}};
  run_element_program(dtype, device, program, ElementLayout{.dims = {n}}, ElementBuffers{.inputs = {x}, .outputs = {y}},
                      n);
}

}  // namespace tapegrad::cuda

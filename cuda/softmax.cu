// softmax and log_softmax along lines [outer, n, inner] (interface: cuda/softmax.hpp).
//
// Lines along the last axis (inner == 1) are contiguous rows: a row group per row (cuda/rows.cuh: a warp for rows
// of up to 1024 elements, the block otherwise, e.g. a 50257-class vocabulary), reading in 16-byte packs where
// aligned. Lines along another axis are strided: a thread per line walks the axis, neighbouring threads taking
// neighbouring lines, whose elements are neighbours in memory (coalesced).
// Forward: the max, then Σ exp(x - max), then y; each line's max and sum are saved. Backward: the line's sum of
// dy·p (softmax) or dy (log_softmax), then dx, with p recomputed from x and the saved statistics.
#include "tapegrad/cuda/softmax.hpp"

#include "tapegrad/cuda/softmax_rows.cuh"

namespace tapegrad::cuda {

namespace {

using rows::Max;
using rows::Sum;

// One line's formulas (the CPU's, ops/softmax.cpp), given its statistics.
template <class C> struct Line {
  bool log;  // log_softmax, else softmax
  C max, sum, log_sum_exp;

  __device__ Line(bool log_, C max_, C sum_)
      : log(log_), max(max_), sum(sum_), log_sum_exp(max_ + rows::log_of(sum_)) {}
  __device__ C p(C x) const { return rows::exp_of(x - max) / sum; }
  __device__ C y(C x) const { return log ? x - log_sum_exp : p(x); }
  // The backward's per-line sum adds term(dy, x) over the line; dx then follows from it.
  __device__ C term(C dy, C x) const { return log ? dy : dy * p(x); }
  __device__ C dx(C dy, C x, C total) const { return log ? dy - p(x) * total : p(x) * (dy - total); }
};

template <class S> struct Params {
  using C = compute_of<S>;
  const S* x;
  const S* dy;  // backward only
  S* out;       // y, or dx
  C* line_max;
  C* line_sum;
  SoftmaxLines lines;
  bool log;
};

template <class S, class Config>
__global__ void __launch_bounds__(Config::block_threads) rows_forward_kernel(Params<S> p) {
  using C = compute_of<S>;
  constexpr int V = Config::V;
  const std::int64_t n = p.lines.n;
  Config::for_each_row(p.lines.outer, [&](std::int64_t r) {
    const auto stats = rows::softmax_stats<Config>(p.x + r * n, n);
    const Line<C> line(p.log, stats.max, stats.sum);
    if (Config::lane() == 0) {
      p.line_max[r] = stats.max;
      p.line_sum[r] = stats.sum;
    }
    Config::for_each_pack(n, [&](std::int64_t q) {
      C v[V];
      rows::load(p.x + r * n, q, v);
      for (int k = 0; k < V; ++k) v[k] = line.y(v[k]);
      rows::store(p.out + r * n, q, v);
    });
  });
}

template <class S, class Config>
__global__ void __launch_bounds__(Config::block_threads) rows_backward_kernel(Params<S> p) {
  using C = compute_of<S>;
  constexpr int V = Config::V;
  const std::int64_t n = p.lines.n;
  Config::for_each_row(p.lines.outer, [&](std::int64_t r) {
    const Line<C> line(p.log, p.line_max[r], p.line_sum[r]);
    C total = 0;
    Config::for_each_pack(n, [&](std::int64_t q) {
      C x[V], dy[V];
      rows::load(p.x + r * n, q, x);
      rows::load(p.dy + r * n, q, dy);
      for (int k = 0; k < V; ++k) total += line.term(dy[k], x[k]);
    });
    total = Config::reduce(total, Sum{});
    Config::for_each_pack(n, [&](std::int64_t q) {
      C x[V], dy[V];
      rows::load(p.x + r * n, q, x);
      rows::load(p.dy + r * n, q, dy);
      for (int k = 0; k < V; ++k) x[k] = line.dx(dy[k], x[k], total);
      rows::store(p.out + r * n, q, x);
    });
  });
}

// Calls body(line, first element) for each line of a thread, grid-stride; element k of the line is at
// first + k·inner.
template <class Body> __device__ void for_each_strided_line(const SoftmaxLines& l, Body body) {
  const std::int64_t count = l.outer * l.inner;
  for (std::int64_t line = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; line < count;
       line += std::int64_t{gridDim.x} * blockDim.x) {
    body(line, (line / l.inner) * l.n * l.inner + line % l.inner);
  }
}

template <class S> __global__ void strided_forward_kernel(Params<S> p) {
  using C = compute_of<S>;
  const std::int64_t n = p.lines.n, inner = p.lines.inner;
  for_each_strided_line(p.lines, [&](std::int64_t line, std::int64_t first) {
    const auto x = [&](std::int64_t k) { return to_compute<C>(p.x[first + k * inner]); };
    C max = -rows::infinity_of<C>();
    for (std::int64_t k = 0; k < n; ++k) max = Max{}(max, x(k));
    C sum = 0;
    for (std::int64_t k = 0; k < n; ++k) sum += rows::exp_of(x(k) - max);
    p.line_max[line] = max;
    p.line_sum[line] = sum;
    const Line<C> l(p.log, max, sum);
    for (std::int64_t k = 0; k < n; ++k) p.out[first + k * inner] = from_compute<S>(l.y(x(k)));
  });
}

template <class S> __global__ void strided_backward_kernel(Params<S> p) {
  using C = compute_of<S>;
  const std::int64_t n = p.lines.n, inner = p.lines.inner;
  for_each_strided_line(p.lines, [&](std::int64_t line, std::int64_t first) {
    const Line<C> l(p.log, p.line_max[line], p.line_sum[line]);
    const auto x = [&](std::int64_t k) { return to_compute<C>(p.x[first + k * inner]); };
    const auto dy = [&](std::int64_t k) { return to_compute<C>(p.dy[first + k * inner]); };
    C total = 0;
    for (std::int64_t k = 0; k < n; ++k) total += l.term(dy(k), x(k));
    for (std::int64_t k = 0; k < n; ++k) p.out[first + k * inner] = from_compute<S>(l.dx(dy(k), x(k), total));
  });
}

// Launches the forward or backward kernel over p's lines: a row kernel when they are rows (inner == 1), else the
// strided one.
template <bool Backward, class S> void launch_lines(const Launch& launch, const Params<S>& p) {
  const SoftmaxLines& l = p.lines;
  if (l.inner == 1) {
    rows::dispatch_rows<S>(l.n, rows::packs_fit<S>(l.n, {p.x, p.dy, p.out}), [&](auto config) {
      using Config = decltype(config);
      const auto kernel = Backward ? rows_backward_kernel<S, Config> : rows_forward_kernel<S, Config>;
      kernel<<<rows::row_blocks<Config>(launch, l.outer), Config::block_threads, 0, launch.stream()>>>(p);
      TAPEGRAD_CUDA_CHECK_LAUNCH();
    });
  } else {
    constexpr int threads = 256;
    const auto kernel = Backward ? strided_backward_kernel<S> : strided_forward_kernel<S>;
    kernel<<<launch.blocks_for(l.outer * l.inner, threads), threads, 0, launch.stream()>>>(p);
    TAPEGRAD_CUDA_CHECK_LAUNCH();
  }
}

bool empty(const SoftmaxLines& l) { return l.outer == 0 || l.n == 0 || l.inner == 0; }

}  // namespace

void softmax_forward(DType dtype, bool log, const SoftmaxLines& lines, const void* x, void* y, void* line_max,
                     void* line_sum, int device) {
  if (empty(lines)) return;
  Launch launch(device);
  dispatch_float(dtype, log ? "log_softmax" : "softmax", [&](auto tag) {
    using S = decltype(tag);
    using C = compute_of<S>;
    launch_lines<false>(launch, Params<S>{static_cast<const S*>(x), nullptr, static_cast<S*>(y),
                                          static_cast<C*>(line_max), static_cast<C*>(line_sum), lines, log});
  });
}

void softmax_backward(DType dtype, bool log, const SoftmaxLines& lines, const void* x, const void* line_max,
                      const void* line_sum, const void* dy, void* dx, int device) {
  if (empty(lines)) return;
  Launch launch(device);
  dispatch_float(dtype, log ? "log_softmax" : "softmax", [&](auto tag) {
    using S = decltype(tag);
    using C = compute_of<S>;
    // The backward only reads the statistics: Params holds them writable for the forward's sake.
    launch_lines<true>(launch, Params<S>{static_cast<const S*>(x), static_cast<const S*>(dy), static_cast<S*>(dx),
                                         static_cast<C*>(const_cast<void*>(line_max)),
                                         static_cast<C*>(const_cast<void*>(line_sum)), lines, log});
  });
}

}  // namespace tapegrad::cuda

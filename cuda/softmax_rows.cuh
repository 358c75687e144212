// Per-row softmax statistics for the row kernels of softmax, log_softmax and cross_entropy: the row's max and the
// sum of exp(x - max), so that exp(x - max) / sum and max + log(sum) never overflow (the CPU's
// ops/detail/softmax_stats.hpp).
#pragma once

#include "tapegrad/cuda/rows.cuh"

namespace tapegrad::cuda::rows {

template <class C> struct SoftmaxStats {
  C max, sum;
};

// The statistics of row x of n elements, the same bits in every thread of the row group (Config: a RowConfig).
template <class Config, class S> __device__ SoftmaxStats<compute_of<S>> softmax_stats(const S* x, std::int64_t n) {
  using C = compute_of<S>;
  constexpr int V = Config::V;
  C max = -infinity_of<C>();
  Config::for_each_pack(n, [&](std::int64_t q) {
    C v[V];
    load(x, q, v);
    for (int k = 0; k < V; ++k) max = Max{}(max, v[k]);
  });
  max = Config::reduce(max, Max{});
  C sum = 0;
  Config::for_each_pack(n, [&](std::int64_t q) {
    C v[V];
    load(x, q, v);
    for (int k = 0; k < V; ++k) sum += exp_of(v[k] - max);
  });
  return {max, Config::reduce(sum, Sum{})};
}

}  // namespace tapegrad::cuda::rows

// Per-line softmax statistics in compute_t<T>, shared by softmax, log_softmax and cross_entropy: the line's max
// and the sum of exp(x - max), so that softmax = exp(x - max) / sum and log-sum-exp = max + log(sum) never
// overflow. Internal: included by ops/*.cpp only.
#pragma once

#include <cmath>
#include <limits>
#include <vector>

#include "tapegrad/ops/detail/lines.hpp"

namespace tapegrad::detail {

template <class C> struct SoftmaxStats {
  std::vector<C> max, sum;  // one entry per line
};

template <class T> SoftmaxStats<compute_t<T>> softmax_stats(const Tensor<T>& x, const AxisLayout& l) {
  using C = compute_t<T>;
  const auto lines = static_cast<std::size_t>(l.lines());
  SoftmaxStats<C> s{std::vector<C>(lines, -std::numeric_limits<C>::infinity()), std::vector<C>(lines, C(0))};
  const T* px = x.data();
  for_each_line_run(l, 3 * l.n, [&](std::int64_t at, std::int64_t line, std::int64_t width) {
    C* max = s.max.data() + line;
    C* sum = s.sum.data() + line;
    for_each_in_run(l, at, width,
                    [&](std::int64_t e, std::int64_t i) { max[i] = std::max(max[i], static_cast<C>(px[e])); });
    for_each_in_run(l, at, width,
                    [&](std::int64_t e, std::int64_t i) { sum[i] += std::exp(static_cast<C>(px[e]) - max[i]); });
  });
  return s;
}

// max + log(sum) per line: the log of the softmax denominator.
template <class C> std::vector<C> log_sum_exp(const SoftmaxStats<C>& s) {
  std::vector<C> lse(s.max.size());
  for (std::size_t k = 0; k < lse.size(); ++k) lse[k] = s.max[k] + std::log(s.sum[k]);
  return lse;
}

}  // namespace tapegrad::detail

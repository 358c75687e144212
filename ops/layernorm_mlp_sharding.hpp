// The collectives of layernorm_mlp's tensor parallelism (LayerNormMLPOptions::tensor_parallel), placed between the
// node's stages on the CPU and the GPU alike; for an unsharded node each step is nothing. Internal: included by
// ops/layernorm_mlp*.cpp only.
#pragma once

#include <optional>
#include <vector>

#include "tapegrad/ops/layernorm_mlp.hpp"

namespace tapegrad::detail {

class MlpSharding {
 public:
  explicit MlpSharding(const std::optional<TensorParallel>& parallel) : parallel_(parallel) {}

  bool sharded() const { return parallel_.has_value(); }
  bool sequence() const { return parallel_ && parallel_->sequence_parallel; }
  // How many times the rows of x the products see: the ranks' rows stacked under sequence parallelism.
  std::int64_t row_factor() const { return sequence() ? parallel_->comm.size() : 1; }
  // Whether this rank adds the terms that the ranks' partial results must hold once (b2 in y): rank 0's does.
  bool adds_replicated_terms() const { return !parallel_ || parallel_->comm.rank() == 0; }

  // Sequence parallel: the ranks' rows stacked in rank order (h before GEMM1, dy before the backward's products).
  template <class T> Tensor<T> gathered_rows(const Tensor<T>& rows) const {
    return sequence() ? parallel_->comm.all_gather(rows) : rows;
  }
  // The ranks' partial results summed (y after GEMM2, dh after its product): this rank's rows of the sum under
  // sequence parallelism (reduce_scatter), all of them otherwise (all_reduce).
  template <class T> Tensor<T> summed(const Tensor<T>& partial) const {
    if (!parallel_) return partial;
    return sequence() ? parallel_->comm.reduce_scatter(partial) : parallel_->comm.all_reduce(partial);
  }
  // Sequence parallel: sums over this rank's rows (dγ, dβ) summed over the ranks.
  template <class C> Tensor<C> row_sums_over_ranks(const Tensor<C>& sums) const {
    return sequence() ? parallel_->comm.all_reduce(sums) : sums;
  }
  template <class C> void sum_row_sums(std::vector<C>& sums) const {
    if (!sequence()) return;
    Tensor<C> t(Shape{static_cast<std::int64_t>(sums.size())});
    std::copy(sums.begin(), sums.end(), t.data());
    t = row_sums_over_ranks(t);
    std::copy(t.data(), t.data() + t.numel(), sums.begin());
  }

 private:
  std::optional<TensorParallel> parallel_;
};

}  // namespace tapegrad::detail

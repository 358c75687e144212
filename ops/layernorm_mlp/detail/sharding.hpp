// The collectives of layernorm_mlp's tensor parallelism (LayerNormMLPOptions::tensor_parallel), which the stages
// (detail/stages.hpp) place between their steps on the CPU and the GPU alike; for an unsharded node each is nothing.
// Internal to ops/layernorm_mlp/.
#pragma once

#include <cstdint>
#include <optional>

#include "tapegrad/ops/fp8/amax_group.hpp"
#include "tapegrad/ops/layernorm_mlp/layernorm_mlp.hpp"

namespace tapegrad::detail::mlp {

class Sharding {
 public:
  explicit Sharding(const std::optional<TensorParallel>& parallel) : parallel_(parallel) {}

  bool sharded() const { return parallel_.has_value(); }
  bool sequence() const { return parallel_ && parallel_->sequence_parallel; }
  // How many times the rows of x the products see: the ranks' rows stacked under sequence parallelism.
  std::int64_t row_factor() const { return sequence() ? parallel_->comm.size() : 1; }
  // Whether this rank adds the terms that the ranks' partial results must hold once (b2 in y): rank 0's does.
  bool adds_replicated_terms() const { return !parallel_ || parallel_->comm.rank() == 0; }

  // The ranks over which fp8 amaxes are reduced: W1's and W2's shards, a (this rank's F/p features) and dz differ
  // from rank to rank; h and dy are replicated or all-gathered before they are quantized, the same on every rank.
  std::optional<fp8::AmaxGroup> amax_group() const {
    if (!parallel_) return std::nullopt;
    using fp8::Role;
    return fp8::AmaxGroup(parallel_->comm, {Role::kernel1, Role::kernel2, Role::activation, Role::grad_hidden});
  }

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

 private:
  std::optional<TensorParallel> parallel_;
};

}  // namespace tapegrad::detail::mlp

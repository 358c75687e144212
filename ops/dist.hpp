// Collectives as tape nodes, to write sharded models with (tensor/dist/communicator.hpp runs them). Each node's
// backward is its dual, as in Megatron-LM's tensor- and sequence-parallel regions:
//
//   op              forward                     backward                 for
//   replicate       identity                    all_reduce               x used by every rank's shard of a product
//   all_reduce      Σ over ranks                identity                 partial results summed into a replicated one
//   all_gather      blocks stacked (first axis) reduce_scatter           a sharded x gathered for sharded compute
//   reduce_scatter  Σ, each rank keeps a block  all_gather               partial results summed into shards
//
// The conventions that make these the gradients: a *replicated* tensor (same value on every rank) used in the same
// way on every rank gets the whole gradient on every rank (all_reduce's output: its loss is computed alike
// everywhere); a tensor that feeds rank-specific (sharded) computation gets that rank's part of the gradient, the
// parts summing to the whole (replicate's output, all_gather's output). So replicate goes before a column-sharded
// product and all_reduce after a row-sharded one; all_gather before sharded compute and reduce_scatter after it.
// A replicated parameter updated by every rank from a partial gradient needs that gradient all-reduced: the sharded
// ops here (and layernorm_mlp's tensor parallelism) return whole gradients for the parameters they replicate.
#pragma once

#include "tapegrad/autodiff/var.hpp"
#include "tapegrad/tensor/dist/communicator.hpp"

namespace tapegrad {

// Tensor parallelism over the ranks of `comm`, for the sharded ops and modules (layernorm_mlp, nn::Dense's parallel
// modes, the modules built on them): tensor parallel alone keeps activations replicated; sequence_parallel shards
// them over their first axis (each rank its own rows, all ranks the same count).
struct TensorParallel {
  dist::Communicator comm;
  bool sequence_parallel = false;
};

}  // namespace tapegrad

namespace tapegrad::dist {

template <class T> Var<T> replicate(const Communicator& comm, const Var<T>& x);
template <class T> Var<T> all_reduce(const Communicator& comm, const Var<T>& x);
template <class T> Var<T> all_gather(const Communicator& comm, const Var<T>& x);
template <class T> Var<T> reduce_scatter(const Communicator& comm, const Var<T>& x);

}  // namespace tapegrad::dist

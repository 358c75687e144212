// Broadcasting plans for elementwise expressions, and the two tensor-level helpers a broadcast needs: expanding a
// tensor to a larger shape and summing a gradient back down to an operand's shape.
#pragma once

#include <array>
#include <initializer_list>
#include <span>
#include <vector>

#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad {

// How an elementwise expression over several operands is evaluated.
//   flat:      every operand has the output's shape: one rank-1 loop.
//   broadcast: after merging adjacent axes that broadcast alike, rank <= 4: Eigen broadcasts at rank 4.
//   expand:    more complex patterns: the broadcast operands are expanded to the output shape first.
struct BroadcastPlan {
  static constexpr int rank = 4;
  enum class Kind { flat, broadcast, expand } kind = Kind::flat;
  Shape output;
  std::array<Eigen::Index, rank> out_dims{};                     // broadcast: the merged output dims
  std::vector<std::array<Eigen::Index, rank>> operand_dims;      // broadcast: each operand's merged dims
  std::vector<std::array<Eigen::Index, rank>> operand_factors;   // broadcast: out_dims / operand_dims
  std::vector<bool> operand_is_full;                             // not flat: the operand has the output's shape

  // Whether operand k already has the output's shape.
  bool full(std::size_t k) const { return kind == Kind::flat || operand_is_full[k]; }
};

// Plans the broadcast of `operands` (throws naming `op` and the shapes when they do not broadcast). Operands of one
// shape (the common case) give a flat plan, made without allocating.
BroadcastPlan plan_broadcast(std::span<const Shape> operands, const char* op);
inline BroadcastPlan plan_broadcast(std::initializer_list<Shape> operands, const char* op) {
  return plan_broadcast(std::span<const Shape>(operands.begin(), operands.size()), op);
}

// `t` broadcast (NumPy rules) to `shape`, materialized.
template <class T> Tensor<T> expand_to(const Tensor<T>& t, const Shape& shape);
// Sums `g` (of a broadcast result's shape) over the broadcast axes, down to `shape`; the inverse of expand_to for
// gradients. The result is on g's device, rounded once to T. On the cpu the sums run in compute_t<T> (f32 for
// f32), in row-major order; on a GPU they run as `sum`'s (ops/reduce.hpp: f64 for f32 and f64, f32 for bf16/f16,
// in a fixed order), so f32 results of the two can differ in the last bits.
template <class T> Tensor<T> sum_to(const Tensor<T>& g, const Shape& shape);

}  // namespace tapegrad

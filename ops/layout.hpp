// Layout ops: they move elements around (or only relabel them) without arithmetic.
//
//   permute(x, dims)           y has axis i = x's axis dims[i]; backward permutes dy by the inverse.
//   transpose(x, a0, a1)       permute that swaps two axes (by default the last two).
//   reshape(x, dims)           a view of x's storage with new dims; one entry may be -1 (inferred).
//   slice(x, axis, start, stop, step)   Python-like x[..., start:stop:step, ...] along one axis (a copy).
//   concat(xs, axis)           the inputs joined along `axis`; the others must agree.
//
// Axes may be negative (counted from the back). Every bad argument throws an Error naming the op and the shapes.
#pragma once

#include <cstdint>
#include <vector>

#include "tapegrad/autodiff/var.hpp"

namespace tapegrad {

template <class T> Var<T> permute(const Var<T>& x, std::vector<int> dims);
template <class T> Var<T> transpose(const Var<T>& x, int axis0 = -2, int axis1 = -1);
// `dims` are the new dimensions; a single -1 stands for whatever makes the element count match. The result shares
// x's storage. (Pass `shape.to_vector()` to reshape to an existing Shape.)
template <class T> Var<T> reshape(const Var<T>& x, std::vector<std::int64_t> dims);
// Negative start/stop count from the back; both are clamped to the axis like Python's; step must be >= 1.
template <class T>
Var<T> slice(const Var<T>& x, int axis, std::int64_t start, std::int64_t stop, std::int64_t step = 1);
template <class T> Var<T> concat(const std::vector<Var<T>>& xs, int axis);

template <VarExpression E> auto permute(const E& e, std::vector<int> dims) { return permute(e.evaluate(), dims); }
template <VarExpression E> auto transpose(const E& e, int axis0 = -2, int axis1 = -1) {
  return transpose(e.evaluate(), axis0, axis1);
}
template <VarExpression E> auto reshape(const E& e, std::vector<std::int64_t> dims) {
  return reshape(e.evaluate(), dims);
}
template <VarExpression E>
auto slice(const E& e, int axis, std::int64_t start, std::int64_t stop, std::int64_t step = 1) {
  return slice(e.evaluate(), axis, start, stop, step);
}

// The tensor-level permute the ops above and the reductions use: a contiguous copy with axis i = t's axis dims[i]
// (or a view of t when the permutation moves no data). `op` names the caller in errors.
template <class T> Tensor<T> permute(const Tensor<T>& t, const std::vector<int>& dims, const char* op = "permute");
// The permutation that undoes `dims`.
std::vector<int> inverse_permutation(const std::vector<int>& dims);

}  // namespace tapegrad

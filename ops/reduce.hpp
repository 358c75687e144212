// Reductions over a set of axes.
//
//   sum(x, axes, keepdim)    mean(x, axes, keepdim)    max(x, axes, keepdim)
//
// `axes` empty means every axis (a rank-0 result, or all ones with keepdim). Negative axes count from the back;
// an axis out of range or named twice throws an Error naming the op, the axis and the shape. keepdim keeps each
// reduced axis with size 1.
// Sums accumulate in double for f32 and f64, in f32 for bf16/f16, and are rounded to T once.
// The mean over zero elements is NaN, as 0/0; max over zero elements throws.
// max's gradient goes to one element per reduced group: the first maximum in row-major order when several tie.
#pragma once

#include <vector>

#include "tapegrad/autodiff/var.hpp"

namespace tapegrad {

template <class T> Var<T> sum(const Var<T>& x, std::vector<int> axes = {}, bool keepdim = false);
template <class T> Var<T> mean(const Var<T>& x, std::vector<int> axes = {}, bool keepdim = false);
template <class T> Var<T> max(const Var<T>& x, std::vector<int> axes = {}, bool keepdim = false);

// The pair a broadcast's gradient goes through, each the other's backward: x broadcast (NumPy rules) to `shape`,
// materialized; and x summed down to `shape`, which broadcasts to x's shape (sums as sum's).
template <class T> Var<T> broadcast_to(const Var<T>& x, const Shape& shape);
template <class T> Var<T> sum_to(const Var<T>& x, const Shape& shape);

template <VarExpression E> auto sum(const E& e, std::vector<int> axes = {}, bool keepdim = false) {
  return sum(e.evaluate(), axes, keepdim);
}
template <VarExpression E> auto mean(const E& e, std::vector<int> axes = {}, bool keepdim = false) {
  return mean(e.evaluate(), axes, keepdim);
}
template <VarExpression E> auto max(const E& e, std::vector<int> axes = {}, bool keepdim = false) {
  return max(e.evaluate(), axes, keepdim);
}

}  // namespace tapegrad

// Losses, each recorded as one tape node with a hand-written backward (ops/loss.cpp). Each returns a rank-0 Var,
// the mean over its terms, computed in compute_t<T> and summed in a fixed order (independent of the thread count).
#pragma once

#include <cstdint>
#include <type_traits>

#include "autodiff/var.hpp"

namespace tapegrad {

// mean((pred - target)²) over all elements; the shapes must match exactly (no broadcasting). Gradients flow to
// both when they require grad.
template <class T> Var<T> mse_loss(const Var<T>& pred, const Var<T>& target);

// Cross-entropy with class indices, fused log-softmax + negative log-likelihood: logits [..., C], labels of logits'
// leading shape [...] holding classes in [0, C). The mean over positions of -log softmax(logits)[label].
template <class T> Var<T> cross_entropy(const Var<T>& logits, const Tensor<std::int64_t>& labels);
// Cross-entropy with soft targets: target_probs has logits' shape, a distribution over the last axis at each
// position. The mean over positions of -Σ_c p_c log softmax(logits)_c. Gradients flow to both.
template <class T> Var<T> cross_entropy(const Var<T>& logits, const Var<T>& target_probs);

namespace detail {
template <class X>
concept VarOrExpression = is_var<std::remove_cvref_t<X>>::value || VarExpression<X>;
// Two operands of which at least one is a lazy expression.
template <class X, class Y>
concept WithExpression = VarOrExpression<X> && VarOrExpression<Y> &&(VarExpression<X> || VarExpression<Y>);
template <class X> auto as_var(const X& x) {
  if constexpr (VarExpression<X>) {
    return x.evaluate();
  } else {
    return x;
  }
}
}  // namespace detail

template <class P, class Q>
requires detail::WithExpression<P, Q>
auto mse_loss(const P& pred, const Q& target) { return mse_loss(detail::as_var(pred), detail::as_var(target)); }
template <VarExpression E> auto cross_entropy(const E& logits, const Tensor<std::int64_t>& labels) {
  return cross_entropy(logits.evaluate(), labels);
}
template <class L, class P>
requires detail::WithExpression<L, P>
auto cross_entropy(const L& logits, const P& target_probs) {
  return cross_entropy(detail::as_var(logits), detail::as_var(target_probs));
}

}  // namespace tapegrad

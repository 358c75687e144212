// Losses, each recorded as one tape node with a hand-written backward (ops/loss.cpp). Each returns a rank-0 Var,
// the mean over its terms, computed in compute_t<T> and summed in a fixed order (independent of the thread count).
#pragma once

#include <cstdint>

#include "tapegrad/autodiff/var.hpp"

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

// Either operand may be a lazy expression.
template <VarLike P, VarLike Q>
  requires(VarExpression<P> || VarExpression<Q>)
auto mse_loss(const P& pred, const Q& target) {
  return mse_loss(eval(pred), eval(target));
}
template <VarExpression E> auto cross_entropy(const E& logits, const Tensor<std::int64_t>& labels) {
  return cross_entropy(logits.evaluate(), labels);
}
template <VarLike L, VarLike P>
  requires(VarExpression<L> || VarExpression<P>)
auto cross_entropy(const L& logits, const P& target_probs) {
  return cross_entropy(eval(logits), eval(target_probs));
}

}  // namespace tapegrad

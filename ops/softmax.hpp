// softmax and log_softmax along one axis, each recorded as one tape node with a hand-written backward
// (ops/softmax.cpp). Numerically stable (the line's max is subtracted first); computed in compute_t<T>.
#pragma once

#include "tapegrad/autodiff/var.hpp"

namespace tapegrad {

// exp(x) / Σ exp(x) along `axis` (negative counts from the back).
template <class T> Var<T> softmax(const Var<T>& x, int axis = -1);
// x - log Σ exp(x) along `axis` (negative counts from the back).
template <class T> Var<T> log_softmax(const Var<T>& x, int axis = -1);

template <VarExpression E> auto softmax(const E& x, int axis = -1) { return softmax(x.evaluate(), axis); }
template <VarExpression E> auto log_softmax(const E& x, int axis = -1) { return log_softmax(x.evaluate(), axis); }

}  // namespace tapegrad

// Second-order products by double backward (reverse over reverse), for second-order optimizers, curvature studies
// and forward-mode directional derivatives without a forward-mode pass.
//
//   std::vector<Tensor<double>> hv = hvp<double>(loss_of, {w}, {v});   // (∇²loss(w)) v
//
// Each records f on a private tape and runs a create_graph backward, then a backward through the recorded
// gradients: about a forward and three backwards' worth of work. Every op on the way must record its backward; one
// that does not throws naming it.
#pragma once

#include <functional>
#include <vector>

#include "tapegrad/autodiff/grad.hpp"

namespace tapegrad {

// The Hessian of the scalar f at x applied to v (one tensor per input, of its shape): for each input k,
// Σ_j ∂²f / ∂x_k ∂x_j · v_j.
template <class T>
std::vector<Tensor<T>> hvp(const DifferentiableFunction<T>& f, const std::vector<Tensor<T>>& x,
                           const std::vector<Tensor<T>>& v);

// The Jacobian of f at x applied to u (one tangent per input): Σ_k ∂f/∂x_k · u_k, of f's shape. By double backward:
// the gradient g(w) = Jᵀw is linear in a seed w, and J u is its derivative in w along u.
template <class T>
Tensor<T> jvp(const DifferentiableFunction<T>& f, const std::vector<Tensor<T>>& x, const std::vector<Tensor<T>>& u);

}  // namespace tapegrad

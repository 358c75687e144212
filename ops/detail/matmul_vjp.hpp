// matmul's vector-Jacobian product without the product: for a block whose create_graph backward needs the gradients
// of a product it never recomputes (ops/layernorm_mlp/recorded_backward.cpp). Recorded as matmul's own create_graph
// backward records them (ops/matmul.cpp): one node per gradient, each differentiable again.
#pragma once

#include "tapegrad/autodiff/var.hpp"

namespace tapegrad::detail {

// The gradients of matmul(a, b) at dc: dA = dc·Bᵀ, given b and a's shape; dB = Aᵀ·dc, given a and b's shape.
template <class T> Var<T> matmul_grad_a(const Shape& a_shape, const Var<T>& b, const Var<T>& dc);
template <class T> Var<T> matmul_grad_b(const Var<T>& a, const Shape& b_shape, const Var<T>& dc);

}  // namespace tapegrad::detail

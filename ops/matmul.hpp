// Matrix products with NumPy/PyTorch `matmul` semantics, recorded as one tape node.
#pragma once

#include "tapegrad/autodiff/var.hpp"

namespace tapegrad {

// [..., M, K] · [..., K, N] -> [..., M, N], the batch axes broadcast (NumPy rules): [2, 1, M, K] · [3, K, N] gives
// [2, 3, M, N]. A rank-1 left operand is a row vector and a rank-1 right operand a column vector, and that unit axis
// is dropped from the result ([K] · [K, N] -> [N], [M, K] · [K] -> [M], [K] · [K] -> []). Large f32/f64 products run
// on CBLAS; bf16/f16 multiply and accumulate in f32 and round once. Operands on a GPU (both on the same one) run on
// cuBLASLt there: f32 exactly unless cuda::set_allow_tf32(true) (cuda/blaslt.hpp) allows TF32.
template <class T> Var<T> matmul(const Var<T>& a, const Var<T>& b);

// matmul(a, b) + bias as one node: bias [N] added to every row of the product (b a matrix or a stack of them) before
// the one rounding, in the compute type (on a GPU, cuBLASLt's bias epilogue); no intermediate product is kept, and
// the bias's gradient is dC summed over its rows. nn::Dense's projection.
template <class T> Var<T> matmul(const Var<T>& a, const Var<T>& b, const Var<T>& bias);

// Either operand may be a lazy expression.
template <VarLike A, VarLike B>
  requires(VarExpression<A> || VarExpression<B>)
auto matmul(const A& a, const B& b) {
  return matmul(eval(a), eval(b));
}

}  // namespace tapegrad

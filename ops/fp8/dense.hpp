// fp8_dense: a linear layer whose two products read FP8 values (TransformerEngine's `dense` with a quantizer set), one
// tape node.
//
//   Fp8Quantization q = fp8_quantization(fp8::DelayedScaling{});   // keep q (its state) from step to step
//   Var<bf16> y = fp8_dense(x, kernel, bias, q);                     // x [..., K], kernel [K, N], bias [N] or {}
//
// y = q(x) · q(kernel) + bias, and backward dx = q(dy) · q(kernel)ᵀ, dkernel = q(x)ᵀ · q(dy), dbias = Σ dy, with
// the roles of ops/fp8/roles.hpp: x is Role::input, the kernel Role::kernel1, dy Role::grad_output (the state's
// other roles stay untouched; the state's own errors name them as layernorm_mlp's: h, w1, dy). Products accumulate in
// C = compute_t<T> and round to T once; the kernel is quantized from its own dtype P and the bias rounded to T; the
// parameters' gradients are summed in C and rounded once to P. On the CPU and, for T in f32, bf16 or f16, on a GPU
// (ops/fp8/detail/dense_gpu.hpp), in every recipe.
//
// A sharded product (nn::Dense's column and row modes, which run the collectives around the node) passes its amax
// group: the ranks whose amaxes are reduced, and which of x, the kernel and dy are shards (ops/fp8/amax_group.hpp);
// every rank of it then runs the node, forward and backward, together.
#pragma once

#include <optional>

#include "tapegrad/autodiff/var.hpp"
#include "tapegrad/ops/fp8/amax_group.hpp"
#include "tapegrad/ops/fp8/recipe.hpp"

namespace tapegrad {

// Throws tapegrad::Error naming the shapes, dtypes or devices that do not fit (an undefined bias means none).
template <class T, class P>
Var<T> fp8_dense(const Var<T>& x, const Var<P>& kernel, const Var<P>& bias, const Fp8Quantization& q,
                 const std::optional<fp8::AmaxGroup>& amax_group = {});

}  // namespace tapegrad

// What layernorm_mlp's stages (detail/stages.hpp) and its two backends (detail/cpu_steps.hpp, detail/gpu_steps.hpp)
// share: the block's sizes, which inputs need a gradient, the parameters as the node gets them, and what the stages
// return. Internal to ops/layernorm_mlp/.
#pragma once

#include <cstdint>

#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::detail::mlp {

// M rows (x's leading dims flattened; under sequence parallelism every rank's), hidden H, ffn F, and n: W1's middle
// axis (2 for gated activations, else 1).
struct Dims {
  std::int64_t rows, hidden, ffn, width;
};

// Which inputs need a gradient, in the node's input order.
struct Needs {
  bool x, gamma, beta, w1, b1, w2, b2;
};

// The parameters as the node gets them; an absent beta or bias is null.
template <class P> struct Params {
  const Tensor<P>& gamma;
  const Tensor<P>* beta;
  const Tensor<P>& w1;
  const Tensor<P>* b1;
  const Tensor<P>& w2;
  const Tensor<P>* b2;
};

// The forward's results: y and h, this rank's rows ([rows, H]; a backend may pad H).
template <class T> struct Forward {
  Tensor<T> y, h;
};

// GEMM1's results: z = h · W1 + b1, and a = act(z) where the product's epilogue made it (undefined otherwise): A is
// a backend's operand (its values, or its codes where the epilogue quantized it).
template <class T, class A = Tensor<T>> struct FirstProduct {
  Tensor<T> z;
  A a;
};

// Every gradient the backward makes, each undefined unless needed: dx in T, the parameters' in the backend's type G
// (the CPU's in its compute type, rounded to P by the node; the GPU's in P already).
template <class T, class G> struct Gradients {
  Tensor<T> dx;
  G dgamma, dbeta, dw1, db1, dw2, db2;
};

// The activation's backward: a (as dW2 reads it), dz, and db1 where asked for.
template <class Operand, class G> struct ActivationGradients {
  Operand a, dz;
  G db1;
};

// The norm's backward: dx, dγ and dβ over this rank's rows, and db2 where it was summed in the same pass.
template <class T, class G> struct NormGradients {
  Tensor<T> dx;
  G dgamma, dbeta, db2;
};

// Which weight a product or a weight gradient is about.
enum class Weight : bool { w1, w2 };

// Whether the norm computes each row's statistics (the forward) or reuses them (a recompute: bitwise the same h).
enum class Statistics : bool { reuse, compute };

}  // namespace tapegrad::detail::mlp

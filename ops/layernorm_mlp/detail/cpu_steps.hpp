// layernorm_mlp on the CPU: what its forward keeps, and the forward and backward that run the stages
// (detail/stages.hpp) on the CPU's operations (cpu_steps.cpp). Internal to ops/layernorm_mlp/.
//
// Each stage rounds to T once; inside it (the products, the bias adds, the activation and its derivative, every sum
// over rows) values are in C = compute_t<T>. The biases enter the products as their initial C (beta = 1), so the add
// costs no pass of its own. Parameter gradients are accumulated in C and rounded once to the parameter dtype P.
#pragma once

#include "tapegrad/ops/detail/norm_rows.hpp"
#include "tapegrad/ops/fp8/detail/operand.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/types.hpp"
#include "tapegrad/ops/layernorm_mlp/layernorm_mlp.hpp"

namespace tapegrad::detail::mlp {

// What the CPU forward keeps: x (shared with the input) with its norm's statistics, γ and β in C, the weights as
// the products read them (rounded to T, or quantized, with the step's scales), the biases in T, and by policy h (as
// dW1 reads it) and z.
template <class T> struct CpuSaved {
  LayerNormMLPOptions options;
  Dims dims{};
  NormRows<T> norm;
  Quantizer<T> quantizer;
  Operand<T> w1, w2;  // W1 [H, nF], W2 [F, H]
  Tensor<T> b1, b2;   // undefined when absent
  Operand<T> h;       // [M, H]
  Tensor<T> z;        // [M, nF]
};

// Fills s and returns y and h, each [rows, H] (rows: x's, this rank's under sequence parallelism).
template <class T, class P>
Forward<T> cpu_forward(CpuSaved<T>& s, const Dims& dims, const LayerNormMLPOptions& options, const Tensor<T>& x,
                       const Params<P>& params);

// From dy and, with return_layernorm_output, dh_out (each [rows, H]): the gradients that `need` asks for, the
// parameters' in C. Reads s only, so that a second backward (retain_graph) gives the same gradients.
template <class T>
Gradients<T, Tensor<compute_t<T>>> cpu_backward(CpuSaved<T>& s, const Tensor<T>& dy, const Tensor<T>* dh_out,
                                                const Needs& need);

}  // namespace tapegrad::detail::mlp

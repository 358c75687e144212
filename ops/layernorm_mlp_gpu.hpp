// layernorm_mlp's GPU path: the CPU's algorithm (ops/layernorm_mlp.cpp) step by step on the launchers of cuda/, every
// temporary a device tensor; the activation backward and the bias gradient db1 in one kernel. Also the types both paths
// share. Internal: included by ops/layernorm_mlp*.cpp only.
//
// Where it differs from the CPU: γ and β are rounded to T for the norm (the CPU widens P to C), so with P wider than T
// the norm output sees γ and β at T's precision. Everything else is rounded where the CPU rounds: h, z, a and y once to
// T; the bias and weight gradients and dγ, dβ summed in C = compute_t<T> and rounded once to P (16-bit GEMMs write f32
// for that, the norm backward sums dγ, dβ and db2 in C). db1 sums dz after its rounding to T, where the CPU sums it
// before.
// GELU with a bias (bf16, f16, f32, ffn a multiple of 8): GEMM1 applies it in cuBLASLt's epilogue, on the sum before
// z's rounding to T, where the CPU computes GELU of the rounded z; the backward's a (for dW2) is made by the
// activation kernel from the rounded z, as the CPU's, so it can differ from the forward's a in T's last bit. The
// backward stays with the activation kernel: cuBLASLt 13's DGELU epilogue ran as an older, slower GEMM kernel, and
// DGELU_BGRAD added the bias gradient in a separate kernel (bench/RESULTS.md (j)).
//
// FP8 (options.fp8, ops/fp8_device.hpp): the same steps with every product an FP8 one of quantized
// operands; h is kept as its transposed codes instead of h, the weights as codes, and the GELU epilogue is not used.
//
// Sizes: where H or F is no multiple of 16 bytes of T, cuBLASLt cannot use its TMA kernels (the rows of every operand
// must start 16-byte aligned) and falls back to kernels ~3× slower. The node then pads: x, its parameters, h, dy
// and everything between the GEMMs take the padded sizes with zeros in the padding (which keeps the padded z, da, dz
// zero there and adds nothing to y, dh or the gradients), and y, dx and the other gradients are cropped out (x and
// the parameters padded in one launch, the backward's crops in one). The norm reads and writes the padded rows
// (cuda::NormProblem::ld), so it keeps its 16-byte loads.
#pragma once

#include <cstdint>
#include <optional>

#include "tapegrad/cuda/norm.hpp"
#include "tapegrad/ops/layernorm_mlp.hpp"
#include "tapegrad/ops/layernorm_mlp_check.hpp"
#include "tapegrad/ops/fp8_device.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::detail {

// Which inputs need a gradient, in the node's input order.
struct MlpNeeds {
  bool x, gamma, beta, w1, b1, w2, b2;
};

// What the GPU forward keeps for the backward: as the CPU's context, on the device.
template <class T> struct DeviceMlp {
  LayerNormMLPOptions options;
  MlpDims dims{};
  // hidden and ffn rounded up to 16 bytes of T (with fp8: to 16 elements): the sizes of the GEMMs' operands (below)
  MlpDims padded{};
  cuda::NormProblem norm;
  Tensor<T> x, gamma, beta;                // x [M, H] padded (else the input's storage); γ, β in T, β maybe undefined
  Tensor<compute_t<T>> mean, rstd;         // per row; mean stays empty for rmsnorm
  Tensor<T> w1, w2, b1, b2;                // in T, padded; a bias is undefined when absent; with fp8 no w1, w2
  Tensor<T> h, z;                          // padded: [M, H] and [M, nF], kept by policy; with fp8 no h
  // With fp8: the step's quantization, W1 [H, nF] and W2 [F, H] in both layouts (padded), and by policy h's
  // transposed codes (what dW1 reads) in place of h.
  std::optional<DeviceFp8> fp8;
  Fp8Codes w1q, w2q, hq;
};

// The parameters as the node gets them; an absent beta or bias is null.
template <class P> struct MlpParams {
  const Tensor<P>& gamma;
  const Tensor<P>* beta;
  const Tensor<P>& w1;
  const Tensor<P>* b1;
  const Tensor<P>& w2;
  const Tensor<P>* b2;
};

template <class T> struct DeviceMlpOutput {
  Tensor<T> y, h;  // [M, H] each; h only with return_layernorm_output
};

// Fills s and returns y and h; x is [..., H] on a GPU (M rows, or this rank's M / p under sequence parallelism).
template <class T, class P>
DeviceMlpOutput<T> device_mlp_forward(DeviceMlp<T>& s, const MlpDims& dims, const LayerNormMLPOptions& options,
                                      const Tensor<T>& x, const MlpParams<P>& params);

template <class T, class P> struct DeviceMlpGrads {
  Tensor<T> dx;                                // [M, H]
  Tensor<P> dgamma, dbeta, dw1, db1, dw2, db2;  // in the parameters' shapes; each undefined unless needed
};

// dy and, with return_layernorm_output, dh_out are [M, H] (any shape of M·H elements; under sequence parallelism
// this rank's rows) on the GPU. Releases the saved h and z once used (a later call recomputes them, bitwise the
// same), and writes dz over z's memory. Tensor parallel: dh's sum over the ranks runs on a side stream beside dW1's
// product (ops/layernorm_mlp_sharding.hpp has the collectives).
template <class T, class P>
DeviceMlpGrads<T, P> device_mlp_backward(DeviceMlp<T>& s, const Tensor<T>& dy, const Tensor<T>* dh_out,
                                         const MlpNeeds& need);

}  // namespace tapegrad::detail

// layernorm_mlp on the GPU: what its forward keeps, and the forward and backward that run the stages
// (detail/stages.hpp) on the launchers of cuda/ (gpu_steps.cpp), every temporary a device tensor. Internal to
// ops/layernorm_mlp/.
//
// Where it differs from the CPU: γ and β are rounded to T for the norm (the CPU widens P to C), so with P wider than T
// the norm output sees γ and β at T's precision. Everything else is rounded where the CPU rounds: h, z, a and y once to
// T; the bias and weight gradients and dγ, dβ summed in C = compute_t<T> and rounded once to P (16-bit GEMMs write f32
// for that, the norm backward sums dγ, dβ and db2 in C). db1 sums dz after its rounding to T, where the CPU sums it
// before. GELU with a bias (bf16, f16, f32, ffn a multiple of 8, no fp8): GEMM1 applies it in cuBLASLt's epilogue, on
// the sum before z's rounding to T, where the CPU computes GELU of the rounded z; the backward's a (for dW2) is made by
// the activation kernel from the rounded z, as the CPU's, so it can differ from the forward's a in T's last bit. The
// backward stays with the activation kernel: cuBLASLt 13's DGELU epilogue ran as an older, slower GEMM kernel, and
// DGELU_BGRAD added the bias gradient in a separate kernel.
//
// Sizes: where H or F is no multiple of what the products need (DeviceQuantizer::padded: 16 bytes of T, of fp8 codes,
// or block scaling's tiles), the node pads: x, its parameters, h, dy and everything between the GEMMs take the padded
// sizes with zeros in the padding (which keeps the padded z, da, dz zero there and adds nothing to y, dh or the
// gradients), and y, dx and the other gradients are cropped out (x and the parameters padded in one launch, the
// backward's crops in one). The norm reads and writes the padded rows (cuda::NormProblem::ld), so it keeps its 16-byte
// loads.
#pragma once

#include <functional>

#include "tapegrad/cuda/norm.hpp"
#include "tapegrad/ops/fp8/detail/device_operand.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/types.hpp"
#include "tapegrad/ops/layernorm_mlp/layernorm_mlp.hpp"

namespace tapegrad::detail::mlp {

// What the GPU forward keeps for the backward, as the CPU's (detail/cpu_steps.hpp), on the device and padded.
template <class T> struct GpuSaved {
  LayerNormMLPOptions options;
  Dims dims{};
  Dims padded{};  // hidden and ffn as the products read them
  cuda::NormProblem norm;
  Tensor<T> x, gamma, beta;         // x [rows, H] padded (else the input's storage); γ, β in T, β maybe undefined
  Tensor<compute_t<T>> mean, rstd;  // per row; mean stays empty for rmsnorm
  DeviceQuantizer<T> quantizer;
  // W1 [H, nF], W2 [F, H]; with fp8 their codes (W2's made by the forward's second product), W1's transpose only
  // where z is remade; the backward gives up each one's codes after its last product, but under recompute_all.
  // Without a weight cache the forward makes W1's transpose alone (GEMM1's), and dh's product W1's codes again from
  // the parameter (w1_codes): they are not held through the step.
  DeviceOperand<T> w1, w2;
  std::function<DeviceOperand<T>()> w1_codes;
  Tensor<T> b1, b2;         // undefined when absent
  DeviceOperand<T> h;       // [M, H], as dW1 reads it; kept by policy
  Tensor<T> z;              // [M, nF]; kept by policy
};

// Fills s and returns y and h, each [rows, H]; x is [..., H] on a GPU (M rows, or this rank's M / p under sequence
// parallelism).
template <class T, class P>
Forward<T> gpu_forward(GpuSaved<T>& s, const Dims& dims, const LayerNormMLPOptions& options, const Tensor<T>& x,
                       const Params<P>& params);

// From dy and, with return_layernorm_output, dh_out (each of rows · H elements, on the GPU): the gradients that
// `need` asks for. Gives up the saved h and z as it goes (a later backward makes them again, bitwise the same), and
// the weights' fp8 codes (but under recompute_all: a later fp8 backward of another policy refuses), and writes dz over
// z's memory. Tensor parallel: dh's sum over the ranks runs on a side stream beside dW1's product.
template <class T, class P>
Gradients<T, Tensor<P>> gpu_backward(GpuSaved<T>& s, const Tensor<T>& dy, const Tensor<T>* dh_out, const Needs& need);

}  // namespace tapegrad::detail::mlp

// Whether an op's fp8 products pay on a GPU: a step's quantization costs passes over its activations, gradients and
// weights, and launches, which the FP8 tensor cores must win back. A model of both decides, per recipe, for the
// ops that quantize (layernorm_mlp, fp8_dense) under cuda::Fp8Dispatch::where_it_pays (cuda/settings.hpp).
//
//   predicted saving = saving · multiply-adds − activation · activation elements − weight · weight elements
//                      − launch · tensors
//
// Its coefficients were fitted to the layernorm_mlp benchmark's steps on an H200 at eight shapes, with and without
// a weight cache (bench/fp8_dispatch_fit.py, docs/fp8.md); there it predicts the fp8 step's ratio to bf16's within
// 0.05 at most shapes (0.12 at worst), and off the shapes it was fitted to it follows how the costs grow: the products' saving
// with M·H·F, the quantization with the tensors' sizes.
#pragma once

#include <cstdint>

#include "tapegrad/ops/fp8/recipe.hpp"

namespace tapegrad::fp8 {

// What one training step (forward and backward) of an op's fp8 products multiplies and quantizes.
struct StepWork {
  double multiply_adds = 0;        // the step's products
  double activation_elements = 0;  // activations and gradients quantized, each tensor once whatever its layouts
  double weight_elements = 0;      // weights quantized (a weight cache's codes are not: Fp8Quantization::weight_cache)
  int tensors = 0;                 // tensors quantized, each with passes and launches of its own

  // layernorm_mlp's [M, H] → [M, width·F] → [M, H]: six products; h, a, dy and dz; W1 and W2.
  static StepWork layernorm_mlp(std::int64_t M, std::int64_t H, std::int64_t F, int width);
  // fp8_dense's [M, K] · [K, N]: three products; x and dy; the kernel.
  static StepWork dense(std::int64_t M, std::int64_t K, std::int64_t N);
};

// The time the step's fp8 products save on the GPU in µs, as the model predicts it (negative: fp8 costs more than
// it saves). With q's weight cache the weights are not counted (its copies are made once for several forwards).
double predicted_gpu_saving_us(const Fp8Quantization& q, const StepWork& work);

// predicted_gpu_saving_us(q, work) > 0.
bool pays_on_gpu(const Fp8Quantization& q, const StepWork& work);

}  // namespace tapegrad::fp8

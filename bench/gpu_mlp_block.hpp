// The layernorm_mlp block the GPU benchmarks run (bench/gpu_layernorm_mlp.cpp, bench/layernorm_mlp_step.cpp): bf16
// input, parameters and output gradient drawn on cuda:0 with ../shared/gpu/peer_bench.py's scales, epsilon 1e-5;
// its products in bf16, or quantized to fp8 by a recipe (delayed scaling's state then lives in the options), with a
// weight cache where asked for (the weights are never changed: every step after the first reuses their codes).
#pragma once

#include <cmath>
#include <memory>
#include <optional>

#include "tapegrad/tapegrad.hpp"

namespace bench {

struct GpuMLPBlock {
  tapegrad::Var<tapegrad::bf16> x, gamma, beta;  // beta undefined for rmsnorm
  tapegrad::MLPKernels<tapegrad::bf16> kernels;
  tapegrad::MLPBiases<tapegrad::bf16> biases;
  tapegrad::Tensor<tapegrad::bf16> dy;
  tapegrad::LayerNormMLPOptions options;

  GpuMLPBlock(std::int64_t M, std::int64_t H, std::int64_t F, tapegrad::NormType norm,
              tapegrad::Activation activation, bool with_biases,
              const std::optional<tapegrad::fp8::Recipe>& fp8 = std::nullopt, bool weight_cache = false) {
    using namespace tapegrad;
    const Device gpu = Device::cuda(0);
    const std::int64_t n = activation_width(activation);
    x = param(randn<bf16>({M, H}, 1, 0.0, 1.0, gpu));
    gamma = param(randn<bf16>({H}, 2, 1.0, 0.1, gpu));
    if (norm == NormType::layernorm) beta = param(randn<bf16>({H}, 3, 0.0, 0.1, gpu));
    kernels = {param(randn<bf16>({H, n, F}, 4, 0.0, 1.0 / std::sqrt(double(H)), gpu)),
               param(randn<bf16>({F, H}, 5, 0.0, 1.0 / std::sqrt(double(F)), gpu))};
    if (with_biases) {
      biases = {param(randn<bf16>({n, F}, 6, 0.0, 0.1, gpu)), param(randn<bf16>({H}, 7, 0.0, 0.1, gpu))};
    }
    dy = randn<bf16>({M, H}, 8, 0.0, 1.0, gpu);
    options = {.norm = norm, .epsilon = 1e-5, .activation = activation};
    if (fp8) options.fp8 = fp8_quantization(*fp8);
    if (fp8 && weight_cache) options.fp8->weight_cache = std::make_shared<fp8::WeightCache>();
  }

  // The recorded forward, as in training.
  tapegrad::Var<tapegrad::bf16> forward() const {
    return tapegrad::layernorm_mlp(x, gamma, beta, kernels, biases, options).y;
  }

  // One training step's work: forward, backward, the gradients dropped and the tape cleared.
  void step() const {
    tapegrad::backward(forward(), dy);
    for (tapegrad::Var<tapegrad::bf16> v : {x, gamma, beta, kernels.w1, kernels.w2, biases.b1, biases.b2}) {
      if (v.defined()) v.zero_grad();
    }
    tapegrad::Tape::active().clear();
  }
};

}  // namespace bench

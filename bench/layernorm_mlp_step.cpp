// One forward+backward step of the layernorm_mlp node (bf16, as bench/gpu_layernorm_mlp.cpp builds it) between
// cudaProfilerStart and cudaProfilerStop, after three unprofiled steps: for a per-kernel profile,
//   ncu --profile-from-start off --metrics gpu__time_duration.sum --csv layernorm_mlp_step M H F gelu|swiglu [autotune]
// gelu: LayerNorm + GELU with biases; swiglu: RMSNorm + SwiGLU without (peer_bench.py's two blocks).
#include <cuda_profiler_api.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "cuda/blaslt.hpp"
#include "cuda/memory.hpp"
#include "tapegrad.hpp"

using namespace tapegrad;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s M H F gelu|swiglu [autotune]\n", argv[0]);
    return 2;
  }
  const std::int64_t M = std::stoll(argv[1]), H = std::stoll(argv[2]), F = std::stoll(argv[3]);
  const bool swiglu = std::string(argv[4]) == "swiglu";
  cuda::set_gemm_autotune(argc > 5 && std::string(argv[5]) == "autotune");
  const Device gpu = Device::cuda(0);
  const std::int64_t n = swiglu ? 2 : 1;
  const Var<bf16> x = param(randn<bf16>({M, H}, 1, 0.0, 1.0, gpu));
  const Var<bf16> gamma = param(randn<bf16>({H}, 2, 1.0, 0.1, gpu));
  const Var<bf16> beta = swiglu ? Var<bf16>() : param(randn<bf16>({H}, 3, 0.0, 0.1, gpu));
  const MLPKernels<bf16> kernels{param(randn<bf16>({H, n, F}, 4, 0.0, 1.0 / std::sqrt(double(H)), gpu)),
                                 param(randn<bf16>({F, H}, 5, 0.0, 1.0 / std::sqrt(double(F)), gpu))};
  const MLPBiases<bf16> biases = swiglu ? MLPBiases<bf16>{}
                                        : MLPBiases<bf16>{param(randn<bf16>({n, F}, 6, 0.0, 0.1, gpu)),
                                                          param(randn<bf16>({H}, 7, 0.0, 0.1, gpu))};
  const Tensor<bf16> dy = randn<bf16>({M, H}, 8, 0.0, 1.0, gpu);
  const LayerNormMLPOptions options{.norm = swiglu ? NormType::rmsnorm : NormType::layernorm,
                                    .epsilon = 1e-5,
                                    .activation = swiglu ? Activation::swiglu : Activation::gelu};
  const auto step = [&] {
    backward(layernorm_mlp(x, gamma, beta, kernels, biases, options).y, dy);
    for (Var<bf16> v : {x, gamma, beta, kernels.w1, kernels.w2, biases.b1, biases.b2}) {
      if (v.defined()) v.zero_grad();
    }
    Tape::active().clear();
  };
  for (int i = 0; i < 3; ++i) step();  // kernels made, GEMM algorithms chosen, the pool warm
  cuda::synchronize(0);
  if (cudaProfilerStart() != cudaSuccess) return std::fprintf(stderr, "cudaProfilerStart failed\n"), 1;
  step();
  cuda::synchronize(0);
  if (cudaProfilerStop() != cudaSuccess) return std::fprintf(stderr, "cudaProfilerStop failed\n"), 1;
}

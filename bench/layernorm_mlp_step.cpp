// One forward+backward step of the layernorm_mlp node (bf16, the block bench/gpu_layernorm_mlp.cpp times) between
// cudaProfilerStart and cudaProfilerStop, after three unprofiled steps: for a per-kernel profile,
//   ncu --profile-from-start off --metrics gpu__time_duration.sum --csv
//       layernorm_mlp_step M H F gelu|swiglu [autotune|heuristic [bf16|delayed|current|block]]   (one command line)
// gelu: LayerNorm + GELU with biases; swiglu: RMSNorm + SwiGLU without (peer_bench.py's two blocks); the last word
// quantizes the products to fp8 with that recipe, at every shape (cuda::Fp8Dispatch::always: the fp8 path's kernels
// even where the default dispatch would run the products in bf16). Prints the profiled step's peak extra device memory
// (`peak_extra_mib`, as bench/gpu_layernorm_mlp.cpp measures it: the most held beyond what was held before it).
#include <cuda_profiler_api.h>

#include <cstdio>
#include <optional>
#include <string>

#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/cuda/settings.hpp"
#include "tapegrad/tensor/gpu/memory.hpp"
#include "gpu_mlp_block.hpp"

using namespace tapegrad;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s M H F gelu|swiglu [autotune|heuristic [bf16|delayed|current|block]]\n", argv[0]);
    return 2;
  }
  const bool swiglu = std::string(argv[4]) == "swiglu";
  cuda::set_gemm_autotune(argc > 5 && std::string(argv[5]) == "autotune");
  cuda::set_fp8_dispatch(cuda::Fp8Dispatch::always);
  const std::string precision = argc > 6 ? argv[6] : "bf16";
  std::optional<fp8::Recipe> recipe;
  if (precision == "delayed") recipe = fp8::DelayedScaling{};
  if (precision == "current") recipe = fp8::CurrentScaling{};
  if (precision == "block") recipe = fp8::BlockScaling{};
  const bench::GpuMLPBlock block(std::stoll(argv[1]), std::stoll(argv[2]), std::stoll(argv[3]),
                                 swiglu ? NormType::rmsnorm : NormType::layernorm,
                                 swiglu ? Activation::swiglu : Activation::gelu, !swiglu, recipe);
  for (int i = 0; i < 3; ++i) block.step();  // kernels made, GEMM algorithms chosen, the pool warm
  cuda::synchronize(0);
  cuda::reset_peak_memory(0);
  const std::size_t before = cuda::memory_stats(0).in_use;
  if (cudaProfilerStart() != cudaSuccess) return std::fprintf(stderr, "cudaProfilerStart failed\n"), 1;
  block.step();
  cuda::synchronize(0);
  if (cudaProfilerStop() != cudaSuccess) return std::fprintf(stderr, "cudaProfilerStop failed\n"), 1;
  std::printf("peak_extra_mib %.1f\n", static_cast<double>(cuda::memory_stats(0).peak_in_use - before) / (1 << 20));
}

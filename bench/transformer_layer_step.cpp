// One training step of nn::TransformerLayer (bench/layer_step.hpp, the step gpu_transformer_layer times) between
// cudaProfilerStart and cudaProfilerStop, after three unprofiled steps, GEMMs and attention plans autotuned: for a
// per-kernel profile,
//   ncu --profile-from-start off --metrics gpu__time_duration.sum --csv
//       transformer_layer_step B S H heads F [bf16|delayed|current|block]
// The last word quantizes the dense parts' products to fp8 with that recipe.
#include <cuda_profiler_api.h>

#include <cstdio>
#include <optional>
#include <string>

#include "layer_step.hpp"
#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/tensor/gpu/memory.hpp"

using namespace tapegrad;

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s B S H heads F [bf16|delayed|current|block]\n", argv[0]);
    return 2;
  }
  const std::string precision = argc > 6 ? argv[6] : "bf16";
  std::optional<fp8::Recipe> recipe;
  if (precision == "delayed") recipe = fp8::DelayedScaling{};
  if (precision == "current") recipe = fp8::CurrentScaling{};
  if (precision == "block") recipe = fp8::BlockScaling{};
  cuda::set_gemm_autotune(true);  // as gpu_transformer_layer times it
  cuda::set_attention_autotune(true);
  const bench::LayerStep step({"layer", std::stoll(argv[1]), std::stoll(argv[2]), std::stoll(argv[3]),
                               std::stoll(argv[4]), std::stoll(argv[5])},
                              recipe, Device::cuda(0));
  for (int i = 0; i < 3; ++i) step();  // kernels made, GEMM algorithms chosen, the pool warm
  cuda::synchronize(0);
  if (cudaProfilerStart() != cudaSuccess) return std::fprintf(stderr, "cudaProfilerStart failed\n"), 1;
  step();
  cuda::synchronize(0);
  if (cudaProfilerStop() != cudaSuccess) return std::fprintf(stderr, "cudaProfilerStop failed\n"), 1;
}

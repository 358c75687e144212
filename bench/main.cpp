// tapegrad micro-benchmarks: one JSON object per measurement on stdout.
//
//   tapegrad_bench [--quick | --reps N] [--threads N] [tape] [fusion] [matmul] [layernorm_mlp] [adjoint] [higher_order]
//                  [attention] [gpu_bandwidth] [gpu_matmul] [gpu_layernorm_mlp] [gpu_higher_order] [gpu_attention]
//                  [gpu_attention_fp8] [gpu_transformer_layer]
//
// With no group named, all run. --quick cuts repetitions (a smoke test); --reps N times N repetitions after 5 untimed
// ones, as the peer scripts do with ITERS=N (equal run lengths keep the GPU's clocks comparable); --threads sets
// tapegrad's pool and OpenBLAS to N threads. The GPU groups exist in builds with CUDA and skip themselves without a GPU.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <set>
#include <string>

#include "bench.hpp"
#include "tapegrad/ops/detail/gemm.hpp"
#include "tapegrad/tensor/eigen.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"

#ifdef TAPEGRAD_HAVE_CBLAS
#include <cblas.h>
#endif

namespace {
const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

constexpr const char* cpu_groups[] = {"tape", "fusion", "matmul", "layernorm_mlp", "adjoint", "higher_order",
                                      "attention"};
constexpr const char* gpu_groups[] = {"gpu_bandwidth",    "gpu_matmul",    "gpu_layernorm_mlp",
                                      "gpu_higher_order", "gpu_attention", "gpu_attention_fp8",
                                      "gpu_transformer_layer"};

bool is_group(const std::string& arg) {
  const auto in = [&](const auto& names) {
    return std::find(std::begin(names), std::end(names), arg) != std::end(names);
  };
  return in(cpu_groups) || (tapegrad::cuda::enabled && in(gpu_groups));
}
}  // namespace

int main(int argc, char** argv) {
  std::set<std::string> groups;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      bench::budget = {.warmup = 1, .min_reps = 2, .min_seconds = 0, .max_reps = 2};
    } else if (arg == "--reps" && i + 1 < argc) {  // the peer scripts' protocol: 5 untimed, then N timed
      const int reps = std::max(1, std::stoi(argv[++i]));
      bench::budget = {.warmup = 5, .min_reps = reps, .min_seconds = 0, .max_reps = reps};
    } else if (arg == "--threads" && i + 1 < argc) {
      tapegrad::set_num_threads(std::stoi(argv[++i]));
    } else if (is_group(arg)) {
      groups.insert(arg);
    } else {
      std::cerr << "usage: tapegrad_bench [--quick | --reps N] [--threads N]";
      for (const char* g : cpu_groups) std::cerr << " [" << g << "]";
      if (tapegrad::cuda::enabled) {
        for (const char* g : gpu_groups) std::cerr << " [" << g << "]";
      }
      std::cerr << "\n";
      return 2;
    }
  }
#ifdef TAPEGRAD_HAVE_CBLAS
  openblas_set_num_threads(tapegrad::num_threads());
#endif
  bench::JsonLine("meta")
      .num("threads", tapegrad::num_threads())
      .num("blas", tapegrad::gemm_has_blas())
      .num("blas_min_work", static_cast<double>(tapegrad::blas_min_work))
      .str("OPENBLAS_CORETYPE", env_or("OPENBLAS_CORETYPE", "(unset)"))
      .str("OPENBLAS_L2_SIZE", env_or("OPENBLAS_L2_SIZE", "(unset)"));
  auto wanted = [&](const char* g) { return groups.empty() || groups.count(g) > 0; };
  if (wanted("tape")) bench::tape_overhead();
  if (wanted("fusion")) bench::fusion();
  if (wanted("matmul")) bench::matmul();
  if (wanted("layernorm_mlp")) bench::layernorm_mlp();
  if (wanted("adjoint")) bench::adjoint();
  if (wanted("higher_order")) bench::higher_order();
  if (wanted("attention")) bench::attention();
  if constexpr (tapegrad::cuda::enabled) {
    if (wanted("gpu_bandwidth")) bench::gpu_bandwidth();
    if (wanted("gpu_matmul")) bench::gpu_matmul();
    if (wanted("gpu_layernorm_mlp")) bench::gpu_layernorm_mlp();
    if (wanted("gpu_higher_order")) bench::gpu_higher_order();
    if (wanted("gpu_attention")) bench::gpu_attention();
    if (wanted("gpu_attention_fp8")) bench::gpu_attention_fp8();
    if (wanted("gpu_transformer_layer")) bench::gpu_transformer_layer();
  }
}

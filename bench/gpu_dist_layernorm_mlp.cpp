// GPU: the LayerNorm-MLP block over the visible GPUs, one rank a GPU on its own thread (Communicator::in_process,
// NCCL): nn::LayerNormMLP in bf16 (issue 28's shapes: LN+GELU with biases, RMSNorm+SwiGLU without), forward + backward
// from a fixed seed gradient, as
//   unsharded   the whole block on GPU 0 (the baseline)
//   tp          tensor parallel over every GPU (x and y replicated)
//   tp_sp       tensor + sequence parallel (each GPU its M / p rows)
//   dp          data parallel: each GPU the whole block and its M / p rows, gradients averaged (nn::DataParallel)
// Every rank runs the same fixed step count (collectives); each times its own steps with CUDA events on its stream,
// and the step's time is the slowest rank's median. One JSON line per (config, mode): median ms, the ratio to the
// unsharded step, and the scaling efficiency t_unsharded / (p · t).
//
//   tapegrad_gpu_dist_bench [--ranks P] [--steps N] [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench.hpp"
#include "tapegrad/tapegrad.hpp"
#include "tapegrad/tensor/gpu/device.hpp"
#include "tapegrad/tensor/gpu/memory.hpp"

using namespace tapegrad;

namespace {

struct Config {
  const char* name;
  std::int64_t M, H, F;
  NormType norm;
  Activation activation;
  bool biases;
};

enum class Mode { unsharded, tp, tp_sp, dp };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::unsharded: return "unsharded";
    case Mode::tp: return "tp";
    case Mode::tp_sp: return "tp_sp";
    case Mode::dp: return "dp";
  }
  return "?";
}

// Median ms of `steps` timed steps (after 3 untimed) of this rank.
double rank_median_ms(const dist::Communicator& comm, const Config& cfg, Mode mode, int steps) {
  const int p = comm.size(), r = comm.rank();
  const Device device = Device::cuda(r);
  const bool rows_split = mode == Mode::tp_sp || mode == Mode::dp;
  std::optional<TensorParallel> parallel;
  if (mode == Mode::tp || mode == Mode::tp_sp) parallel = TensorParallel{comm, mode == Mode::tp_sp};
  nn::LayerNormMLP<bf16> model(cfg.H,
                               {.intermediate_dim = cfg.F, .activation = cfg.activation,
                                .norm = {.norm_type = cfg.norm, .epsilon = 1e-5}, .use_bias = cfg.biases,
                                .tensor_parallel = parallel},
                               7, device);
  std::optional<nn::DataParallel> ddp;
  if (mode == Mode::dp) ddp.emplace(model, comm);
  const std::int64_t rows = rows_split ? cfg.M / p : cfg.M;
  const Var<bf16> x = param(randn<bf16>({rows, cfg.H}, 1 + static_cast<std::uint64_t>(r), 0.0, 1.0, device));
  const Tensor<bf16> dy = randn<bf16>({rows, cfg.H}, 2, 0.0, 1.0, device);
  const cuda::Stream stream = cuda::current_stream(r);
  std::vector<cudaEvent_t> marks(2 * static_cast<std::size_t>(steps));
  for (auto& e : marks) cudaEventCreate(&e);
  for (int step = -3; step < steps; ++step) {
    if (step >= 0) cudaEventRecord(marks[2 * step], stream);
    backward(model(x), dy);
    if (ddp) ddp->finish_gradients();
    if (step >= 0) cudaEventRecord(marks[2 * step + 1], stream);
    for (auto& parameter : model.parameters()) std::visit([](auto v) { v.zero_grad(); }, parameter.var);
    x.slot()->grad = Tensor<bf16>();
    Tape::active().clear();
  }
  cuda::synchronize(r);
  std::vector<double> ms;
  for (int step = 0; step < steps; ++step) {
    float t = 0;
    cudaEventElapsedTime(&t, marks[2 * step], marks[2 * step + 1]);
    ms.push_back(t);
  }
  for (auto& e : marks) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The slowest rank's median step, every rank on its own thread.
double step_ms(int ranks, const Config& cfg, Mode mode, int steps) {
  const auto comms = dist::Communicator::in_process(ranks, {.name = mode_name(mode)});
  std::vector<double> medians(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  std::mutex failure_mutex;
  std::string failure;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        medians[static_cast<std::size_t>(r)] = rank_median_ms(comms[static_cast<std::size_t>(r)], cfg, mode, steps);
      } catch (const std::exception& e) {
        const std::lock_guard lock(failure_mutex);
        if (failure.empty()) failure = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  check(failure.empty(), "tapegrad_gpu_dist_bench", failure);
  return *std::max_element(medians.begin(), medians.end());
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = cuda::device_count(), steps = 20;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--ranks" && i + 1 < argc) {
      ranks = std::stoi(argv[++i]);
    } else if (arg == "--steps" && i + 1 < argc) {
      steps = std::stoi(argv[++i]);
    } else if (arg == "--quick") {
      quick = true;
    } else {
      std::fprintf(stderr, "usage: tapegrad_gpu_dist_bench [--ranks P] [--steps N] [--quick]\n");
      return 2;
    }
  }
  if (cuda::device_count() == 0 || !dist::has_nccl()) {
    bench::JsonLine("gpu_dist_layernorm_mlp").str("skipped", "no GPU, or a build without NCCL");
    return 0;
  }
  std::vector<Config> configs{{"gpt_4k", 8192, 4096, 16384, NormType::layernorm, Activation::gelu, true},
                              {"llama_4k", 8192, 4096, 11008, NormType::rmsnorm, Activation::swiglu, false}};
  if (quick) configs = {{"small", 1024, 256, 1024, NormType::layernorm, Activation::gelu, true}};
  for (const Config& cfg : configs) {
    const double one = step_ms(1, cfg, Mode::unsharded, steps);
    for (Mode mode : {Mode::unsharded, Mode::tp, Mode::tp_sp, Mode::dp}) {
      const double t = mode == Mode::unsharded ? one : step_ms(ranks, cfg, mode, steps);
      const int p = mode == Mode::unsharded ? 1 : ranks;
      bench::JsonLine("gpu_dist_layernorm_mlp")
          .str("config", cfg.name)
          .shape(Shape{cfg.M, cfg.H, cfg.F}, "M_H_F")
          .str("mode", mode_name(mode))
          .num("gpus", p)
          .num("median_ms", t)
          .num("ratio_to_unsharded", t / one)
          .num("scaling_efficiency", one / (p * t));
    }
  }
}

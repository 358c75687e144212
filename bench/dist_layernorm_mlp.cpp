// The tensor-parallel layernorm_mlp node on the CPU over MPI ranks: one training step (forward + backward from a
// fixed seed gradient) of the block sharded over the job's ranks (tensor parallel, and with sequence parallelism),
// or, with one rank, of the unsharded node. One JSON line per (shape, dtype, mode) from rank 0: the median step
// time over a fixed number of steps (every rank runs the same count: collectives), and the bytes each rank sends per
// step in the ring algorithms' count, 2(p-1)/p of each all_reduce's tensor and (p-1)/p of each gathered or
// scattered whole (bench/dist_bench.sh measures what Open MPI actually sent).
//
//   mpirun -np P tapegrad_dist_bench [--steps N] [--threads T] [--only M,H,F] [--mode tensor|sequence]
//                                    [--dtype f32|f64]
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "bench.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;

namespace {

struct Config {
  std::int64_t M, H, F;
};

template <class T>
void run(const dist::Communicator& world, const Config& cfg, bool sequence, int steps) {
  const int p = world.size(), r = world.rank();
  const bool sharded = p > 1;
  const std::int64_t F = cfg.F / p, rows = sequence ? cfg.M / p : cfg.M;
  const Var<T> x = param(randn<T>({rows, cfg.H}, 1 + r, 0.0, 1.0));
  const Var<T> gamma = param(randn<T>({cfg.H}, 2, 1.0, 0.1)), beta = param(randn<T>({cfg.H}, 3, 0.0, 0.1));
  const MLPKernels<T> kernels{param(randn<T>({cfg.H, 1, F}, 4 + r, 0.0, 1.0 / std::sqrt(double(cfg.H)))),
                              param(randn<T>({F, cfg.H}, 5 + r, 0.0, 1.0 / std::sqrt(double(cfg.F))))};
  const MLPBiases<T> biases{param(randn<T>({1, F}, 6 + r, 0.0, 0.1)), param(randn<T>({cfg.H}, 7, 0.0, 0.1))};
  const Tensor<T> dy = randn<T>({rows, cfg.H}, 8);
  LayerNormMLPOptions options{.activation = Activation::gelu};
  if (sharded) options.tensor_parallel = TensorParallel{world, sequence};

  std::vector<double> ns;
  for (int step = 0; step < steps + 2; ++step) {  // two untimed steps first
    world.barrier();
    const auto start = std::chrono::steady_clock::now();
    backward(layernorm_mlp(x, gamma, beta, kernels, biases, options).y, dy);
    const auto stop = std::chrono::steady_clock::now();
    Tape::active().clear();
    for (Var<T> v : {x, gamma, beta, kernels.w1, kernels.w2, biases.b1, biases.b2}) v.zero_grad();
    if (step >= 2) ns.push_back(std::chrono::duration<double, std::nano>(stop - start).count());
  }
  std::sort(ns.begin(), ns.end());
  // Per rank and step: y's and dh's all_reduce (tensor parallel), or h's and dy's all_gather and y's and dh's
  // reduce_scatter of [M, H] wholes plus dγ's and dβ's all_reduce (sequence parallel).
  const double whole = double(cfg.M * cfg.H * sizeof(T)), share = double(p - 1) / p;
  const double ring_bytes = !sharded ? 0.0 : sequence ? 4 * share * whole + 2 * 2 * share * double(cfg.H * sizeof(T))
                                                      : 2 * 2 * share * whole;
  if (r != 0) return;
  bench::JsonLine("dist_layernorm_mlp")
      .num("ranks", p)
      .str("mode", !sharded ? "unsharded" : sequence ? "tensor+sequence parallel" : "tensor parallel")
      .str("dtype", dtype_name(dtype_v<T>))
      .shape(Shape{cfg.M, cfg.H, cfg.F}, "M_H_F")
      .num("threads", num_threads())
      .num("steps", steps)
      .num("median_ms", ns[ns.size() / 2] / 1e6)
      .num("ring_bytes_per_rank_step", ring_bytes);
}

}  // namespace

int main(int argc, char** argv) {
  dist::Session session(argc, argv);
  int steps = 20;
  std::vector<Config> configs{{256, 256, 1024}, {1024, 512, 2048}};
  std::string mode, dtype;  // empty: both
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--steps" && i + 1 < argc) {
      steps = std::stoi(argv[++i]);
    } else if (arg == "--threads" && i + 1 < argc) {
      set_num_threads(std::stoi(argv[++i]));
    } else if (arg == "--only" && i + 1 < argc) {
      Config c{};
      if (std::sscanf(argv[++i], "%ld,%ld,%ld", &c.M, &c.H, &c.F) != 3) return 2;
      configs = {c};
    } else if (arg == "--mode" && i + 1 < argc) {
      mode = argv[++i];
    } else if (arg == "--dtype" && i + 1 < argc) {
      dtype = argv[++i];
    } else {
      std::cerr << "usage: mpirun -np P tapegrad_dist_bench [--steps N] [--threads T] [--only M,H,F] "
                   "[--mode tensor|sequence] [--dtype f32|f64]\n";
      return 2;
    }
  }
  const auto world = dist::Communicator::world();
  for (const Config& cfg : configs) {
    for (bool sequence : {false, true}) {
      if (world.size() == 1 && sequence) continue;  // (one rank: the unsharded node once)
      if (!mode.empty() && (mode == "sequence") != sequence) continue;
      if (dtype != "f64") run<float>(world, cfg, sequence, steps);
      if (dtype != "f32") run<double>(world, cfg, sequence, steps);
    }
  }
}

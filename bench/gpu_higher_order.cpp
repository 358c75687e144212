// GPU: second derivatives through the layernorm_mlp node at gpu_layernorm_mlp's configurations gpt_1k and gpt_4k
// (bf16, LN + GELU (tanh) with biases, autotuned GEMMs): a Hessian-vector product of Σ y·dy (the node's forward, a
// create_graph backward through its composite, a backward through Σ ⟨gradient, v⟩) against one forward + backward
// step, medians of CUDA-event timings; bench/peer_torch_hvp.py times PyTorch's double backward through its unfused
// block on the same math. The ratio hvp_over_step is what a second-order step pays over a first-order one.
#include "gpu_mlp_block.hpp"
#include "gpu_timing.hpp"
#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/tapegrad.hpp"

namespace bench {

namespace {

using namespace tapegrad;

struct Config {
  const char* name;
  std::int64_t M, H, F;
};
constexpr Config configs[] = {{"gpt_1k", 4096, 1024, 4096}, {"gpt_4k", 8192, 4096, 16384}};

void run_config(const Config& c) {
  const GpuMLPBlock block(c.M, c.H, c.F, NormType::layernorm, Activation::gelu, true);
  const std::vector<Var<bf16>> inputs{block.x,          block.gamma,     block.beta,     block.kernels.w1,
                                      block.biases.b1, block.kernels.w2, block.biases.b2};
  std::vector<Tensor<bf16>> directions;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    directions.push_back(randn<bf16>(inputs[k].shape(), 20 + k, 0.0, 1.0, Device::cuda(0)));
  }
  const auto hvp_step = [&] {
    const std::vector<Var<bf16>> g =
        grad({block.forward()}, inputs, {.seeds = {constant(block.dy)}, .create_graph = true});
    Var<bf16> inner = sum(g[0] * constant(directions[0]));
    for (std::size_t k = 1; k < g.size(); ++k) inner = inner + sum(g[k] * constant(directions[k]));
    backward(inner);
    for (Var<bf16> v : inputs) v.zero_grad();
    Tape::active().clear();
  };
  const std::vector<Timing> t = measure_gpu({[&] { block.step(); }, hvp_step});
  const char* modes[] = {"forward_backward", "hvp"};
  for (std::size_t m = 0; m < 2; ++m) {
    JsonLine("gpu_higher_order")
        .str("config", c.name)
        .shape({c.M, c.H, c.F}, "mhf")
        .str("mode", modes[m])
        .num("median_ms", t[m].median_ns * 1e-6)
        .num("hvp_over_step", t[1].median_ns / t[0].median_ns)
        .timing(t[m]);
  }
}

}  // namespace

void gpu_higher_order() {
  if (!gpu_available("gpu_higher_order")) return;
  cuda::set_gemm_autotune(true);
  for (const Config& c : configs) run_config(c);
  cuda::set_gemm_autotune(false);
}

}  // namespace bench

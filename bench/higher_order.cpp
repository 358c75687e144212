// (e) Second derivatives on the CPU: a Hessian-vector product of a loss through the layernorm_mlp node (hvp: the
// node's forward, a create_graph backward through its composite, and a backward through that) against one gradient
// (the node's forward and fused backward), for LN+GELU and LN+SwiGLU with biases, f32 and f64. The ratio
// hvp_over_gradient is what a second-order step pays over a first-order one.
#include "bench.hpp"
#include "cpu_mlp_block.hpp"
#include "tapegrad/tapegrad.hpp"

namespace bench {

namespace {

using namespace tapegrad;

template <class T> void run_config(const MLPBlockConfig& cfg, Activation activation) {
  const std::vector<Tensor<T>> inputs = mlp_block_inputs<T>(cfg, activation);
  std::vector<Tensor<T>> directions;
  for (std::size_t k = 0; k < inputs.size(); ++k) directions.push_back(randn<T>(inputs[k].shape(), 20 + k));
  const Var<T> weights = constant(randn<T>({cfg.M, cfg.H}, 8));
  const DifferentiableFunction<T> loss = [&](const std::vector<Var<T>>& in) {
    const LayerNormMLPOutput<T> out =
        layernorm_mlp(in[0], in[1], in[2], {in[3], in[5]}, {in[4], in[6]}, {.activation = activation});
    return sum(out.y * weights);
  };
  const std::vector<Timing> timings = measure({
      {[&] {
        Tape tape;
        const TapeScope scope(tape);
        std::vector<Var<T>> in;
        for (const Tensor<T>& t : inputs) in.push_back(param(t));
        (void)grad({loss(in)}, in);
      }},
      {[&] { (void)hvp(loss, inputs, directions); }},
  });
  const char* modes[] = {"gradient", "hvp"};
  for (std::size_t m = 0; m < 2; ++m) {
    JsonLine("higher_order")
        .str("mode", modes[m])
        .str("activation", activation_name(activation))
        .shape({cfg.M, cfg.H, cfg.F}, "mhf")
        .str("dtype", std::string(dtype_name(dtype_v<T>)))
        .timing(timings[m])
        .num("hvp_over_gradient", timings[1].median_ns / timings[0].median_ns);
  }
}

}  // namespace

void higher_order() {
  for (const MLPBlockConfig& cfg : mlp_block_configs) {
    for (Activation activation : mlp_block_activations) {
      run_config<float>(cfg, activation);
      run_config<double>(cfg, activation);
    }
  }
}

}  // namespace bench

// (d) The layernorm_mlp node against the same block from primitive ops (layernorm_mlp_composite: ~7 nodes), on the
// CPU, for LN+GELU with biases and LN+SwiGLU. Timed without a tape (NoGradGuard), recorded, and recorded +
// backward from a random seed; the gradient/forward ratio is (recorded forward + backward) / no_grad forward.
// Memory: the bytes a recorded forward leaves held beyond its output (what the tape saves for backward), for the
// node under each recompute policy and for the composite.
#include <memory>

#include "bench.hpp"
#include "cpu_mlp_block.hpp"
#include "tapegrad/tapegrad.hpp"

namespace bench {

namespace {

using namespace tapegrad;

template <class T> void run_config(const MLPBlockConfig& cfg, Activation activation) {
  const std::vector<Tensor<T>> in = mlp_block_inputs<T>(cfg, activation);
  const Var<T> x = param(in[0]), gamma = param(in[1]), beta = param(in[2]);
  const MLPKernels<T> kernels{param(in[3]), param(in[5])};
  const MLPBiases<T> biases{param(in[4]), param(in[6])};
  const Tensor<T> seed = randn<T>({cfg.M, cfg.H}, 8);
  const LayerNormMLPOptions options{.activation = activation};

  struct Form {
    const char* name;
    std::function<Var<T>()> f;
  };
  const Form forms[] = {
      {"node", [&] { return layernorm_mlp(x, gamma, beta, kernels, biases, options).y; }},
      {"composite", [&] { return layernorm_mlp_composite(x, gamma, beta, kernels, biases, options).y; }},
  };
  std::vector<Body> bodies;
  std::vector<std::unique_ptr<Tape>> tapes(std::size(forms));
  std::vector<Var<T>> outputs(std::size(forms));
  auto teardown = [&](std::size_t k) {
    return [&, k] {
      outputs[k] = Var<T>();
      tapes[k].reset();
      for (Var<T> v : {x, gamma, beta, kernels.w1, kernels.w2, biases.b1, biases.b2}) v.zero_grad();
    };
  };
  for (std::size_t k = 0; k < std::size(forms); ++k) {
    auto forward = [&, k] {
      tapes[k] = std::make_unique<Tape>();
      TapeScope scope(*tapes[k]);
      outputs[k] = forms[k].f();
    };
    bodies.push_back({[&, k] {
      NoGradGuard no_grad;
      forms[k].f();
    }});
    bodies.push_back({forward, teardown(k)});
    bodies.push_back({[&, k, forward] {
                        forward();
                        backward(outputs[k], seed);
                      },
                      teardown(k)});
  }
  const std::vector<Timing> timings = measure(bodies);
  const char* modes[] = {"no_grad", "recorded_forward", "recorded_forward_backward"};
  for (std::size_t k = 0; k < std::size(forms); ++k) {
    for (std::size_t m = 0; m < 3; ++m) {
      const Timing& t = timings[3 * k + m];
      JsonLine("layernorm_mlp")
          .str("form", forms[k].name)
          .str("activation", activation_name(activation))
          .str("mode", modes[m])
          .shape({cfg.M, cfg.H, cfg.F}, "mhf")
          .str("dtype", std::string(dtype_name(dtype_v<T>)))
          .timing(t)
          .num("gradient_over_forward", timings[3 * k + 2].median_ns / timings[3 * k].median_ns);
    }
  }
}

// What the tape keeps after a recorded forward of f, beyond the output.
template <class T> double saved_bytes(const std::function<Var<T>()>& f) {
  Tape tape;
  TapeScope scope(tape);
  const std::int64_t before = allocated_bytes();
  const Var<T> y = f();
  return static_cast<double>(allocated_bytes() - before) - static_cast<double>(y.numel() * sizeof(T));
}

template <class T> void report_memory(const MLPBlockConfig& cfg, Activation activation) {
  const std::int64_t n = activation_width(activation);
  const Var<T> x = param(randn<T>({cfg.M, cfg.H}, 1)), gamma = param(ones<T>({cfg.H})), beta = param(zeros<T>({cfg.H}));
  const MLPKernels<T> kernels{param(randn<T>({cfg.H, n, cfg.F}, 4)), param(randn<T>({cfg.F, cfg.H}, 5))};
  const MLPBiases<T> biases{param(zeros<T>({n, cfg.F})), param(zeros<T>({cfg.H}))};
  auto line = [&](const char* form, double bytes) {
    JsonLine("layernorm_mlp_memory")
        .str("form", form)
        .str("activation", activation_name(activation))
        .shape({cfg.M, cfg.H, cfg.F}, "mhf")
        .str("dtype", std::string(dtype_name(dtype_v<T>)))
        .num("saved_bytes", bytes)
        .num("x_bytes", static_cast<double>(x.numel() * sizeof(T)));
  };
  for (Recompute policy : {Recompute::save_all, Recompute::recompute_norm, Recompute::recompute_all}) {
    const LayerNormMLPOptions options{.activation = activation, .recompute = policy};
    line(("node " + std::string(recompute_name(policy))).c_str(),
         saved_bytes<T>([&] { return layernorm_mlp(x, gamma, beta, kernels, biases, options).y; }));
  }
  line("composite", saved_bytes<T>([&] {
         return layernorm_mlp_composite(x, gamma, beta, kernels, biases, {.activation = activation}).y;
       }));
}

}  // namespace

void layernorm_mlp() {
  for (const MLPBlockConfig& cfg : mlp_block_configs) {
    for (Activation activation : mlp_block_activations) {
      run_config<float>(cfg, activation);
      run_config<double>(cfg, activation);
      report_memory<float>(cfg, activation);
    }
  }
}

}  // namespace bench

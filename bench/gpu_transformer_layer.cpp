// GPU: one training step of nn::TransformerLayer (forward, then backward into every parameter and the input), which
// bench/peer_transformer_layer.py times for the peers (PyTorch eager, torch.compile, JAX jit) on the same math:
// pre-norm, x + out(attention(qkv(LN(x)))) with causal attention, then + the MLP of LN(.) with GELU (tanh); biases
// everywhere, LayerNorm epsilon 1e-5, bf16 parameters and compute, B·S = 8192 tokens. Medians of CUDA-event timings,
// TFLOP/s on the step's GEMM and attention flops, and the step's peak extra device memory. Where the attention is
// still the composite of recorded ops on the GPU (S × S scores), a configuration the device cannot hold reports the
// error on its line. Each configuration runs in bf16 and with fp8 delayed scaling on the dense parts (qkv, out and
// the MLP's two GEMMs; the attention stays bf16), TransformerEngine's default recipe.
#include <optional>
#include <variant>

#include "attention_step.hpp"
#include "gpu_timing.hpp"
#include "tapegrad/cuda/blaslt.hpp"

namespace bench {

namespace {

using namespace tapegrad;

struct Config {
  const char* name;  // peer_transformer_layer.py's
  std::int64_t B, S, H, heads, F;
};
constexpr Config configs[] = {{"layer_4k", 4, 2048, 4096, 32, 16384}, {"layer_1k", 4, 2048, 1024, 16, 4096}};

// Forward GEMMs 2·tokens·(4·H² + 2·H·F) (qkv, out, the MLP's two), tripled by the backward; attention as
// attention_step.hpp counts it.
double step_flops(const Config& c) {
  const double tokens = double(c.B) * double(c.S), H = double(c.H);
  const AttentionShape attention{c.name, c.B, c.S, c.heads, c.heads, c.H / c.heads};
  return 3 * 2 * tokens * (4 * H * H + 2 * H * double(c.F)) +
         attention_forward_flops(attention, true) * (1 + attention_backward_over_forward);
}

void run_config(const Config& c, const std::optional<fp8::Recipe>& fp8) {
  const Device gpu = Device::cuda(0);
  const nn::TransformerLayer<bf16> layer(
      c.H,
      {.num_heads = c.heads, .ffn_dim = c.F, .activation = Activation::gelu, .norm = {.epsilon = 1e-5}, .fp8 = fp8},
      0, gpu);
  Var<bf16> x = param(randn<bf16>({c.B, c.S, c.H}, 1, 0.0, 1.0, gpu));
  const Tensor<bf16> dy = randn<bf16>({c.B, c.S, c.H}, 2, 0.0, 1.0, gpu);
  const nn::ParameterList parameters = layer.parameters();
  const auto step = [&] {
    backward(layer(x), dy);
    for (const nn::NamedParameter& p : parameters) std::visit([](auto v) { v.zero_grad(); }, p.var);
    x.zero_grad();
    Tape::active().clear();
  };
  const Timing t = measure_gpu(step);
  const double peak = peak_extra_mib(step);
  JsonLine("gpu_transformer_layer")
      .str("config", c.name)
      .shape({c.B, c.S, c.H, c.heads, c.F}, "b_s_h_heads_f")
      .str("mode", "forward_backward")
      .str("precision", fp8 ? "fp8_delayed" : "bf16")
      .num("median_ms", t.median_ns * 1e-6)
      .num("tflops", step_flops(c) / t.median_ns * 1e-3)
      .num("peak_extra_mib", peak)
      .timing(t);
}

}  // namespace

void gpu_transformer_layer() {
  if (!gpu_available("gpu_transformer_layer")) return;
  cuda::set_gemm_autotune(true);
  const std::optional<fp8::Recipe> precisions[] = {std::nullopt, fp8::DelayedScaling{}};
  for (const Config& c : configs) {
    for (const std::optional<fp8::Recipe>& fp8 : precisions) {
      if (const auto error = failure_of([&] { run_config(c, fp8); })) {
        JsonLine("gpu_transformer_layer")
            .str("config", c.name)
            .str("precision", fp8 ? "fp8_delayed" : "bf16")
            .str("error", *error);
      }
    }
  }
  cuda::set_gemm_autotune(false);
}

}  // namespace bench

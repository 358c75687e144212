// GPU: one training step of nn::TransformerLayer (forward, then backward into every parameter and the input), which
// bench/peer_transformer_layer.py times for the peers (PyTorch eager, torch.compile, JAX jit) on the same math:
// pre-norm, x + out(attention(qkv(LN(x)))) with causal attention, then + the MLP of LN(.) with GELU (tanh); biases
// everywhere, LayerNorm epsilon 1e-5, bf16 parameters and compute, B·S = 8192 tokens. Medians of CUDA-event timings,
// TFLOP/s on the step's GEMM and attention flops, the step's peak extra device memory and what its forward holds for
// the backward (held_after_forward_mib), the host's time to queue a step (host_queue_ms: above median_ms, the GPU
// waits for launches) and the step captured once as a CUDA graph and replayed (graph_median_ms); a configuration
// that fails reports the error on its line. Each configuration runs in bf16 and with fp8 delayed scaling on the dense
// parts (qkv, out and the MLP's two GEMMs; the attention stays bf16), TransformerEngine's default recipe.
#include <optional>

#include "gpu_timing.hpp"
#include "layer_step.hpp"
#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/tensor/gpu/graph.hpp"

namespace bench {

namespace {

using namespace tapegrad;

constexpr LayerShape configs[] = {{"layer_4k", 4, 2048, 4096, 32, 16384}, {"layer_1k", 4, 2048, 1024, 16, 4096}};

void run_config(const LayerShape& c, const std::optional<fp8::Recipe>& fp8) {
  const LayerStep layer_step(c, fp8, Device::cuda(0));
  const auto step = [&] { layer_step(); };
  const Timing t = measure_gpu(step);
  const Timing host = host_queue_time(step);
  const double peak = peak_extra_mib(step);
  const cuda::Graph graph = cuda::Graph::capture(0, step);  // after the timed steps: kernels made, GEMMs chosen
  const Timing replayed = measure_gpu([&] { graph.replay(); });
  // What the forward holds for the backward (y included), as peer_transformer_layer.py reports torch eager's.
  Var<bf16> y;
  const double held = held_after_mib([&] { y = layer_step.forward(); });
  layer_step.backward(y);
  JsonLine("gpu_transformer_layer")
      .str("config", c.name)
      .shape({c.B, c.S, c.H, c.heads, c.F}, "b_s_h_heads_f")
      .str("mode", "forward_backward")
      .str("precision", fp8 ? "fp8_delayed" : "bf16")
      .num("median_ms", t.median_ns * 1e-6)
      .num("tflops", layer_step_flops(c) / t.median_ns * 1e-3)
      .num("host_queue_ms", host.median_ns * 1e-6)
      .num("graph_median_ms", replayed.median_ns * 1e-6)
      .num("peak_extra_mib", peak)
      .num("held_after_forward_mib", held)
      .timing(t);
}

}  // namespace

void gpu_transformer_layer() {
  if (!gpu_available("gpu_transformer_layer")) return;
  cuda::set_gemm_autotune(true);
  cuda::set_attention_autotune(true);
  const std::optional<fp8::Recipe> precisions[] = {std::nullopt, fp8::DelayedScaling{}};
  for (const LayerShape& c : configs) {
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
  cuda::set_attention_autotune(false);
}

}  // namespace bench

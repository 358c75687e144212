// GPU: the layernorm_mlp node on the configurations of issue 5, which ../shared/gpu/peer_bench.py times for the peers
// (PyTorch eager, torch.compile, JAX jit, the six GEMMs alone) on the same math and shapes: bf16, epsilon 1e-5, LN +
// GELU (tanh) with biases, or RMSNorm + SwiGLU without. For each: the recorded forward (as in training), forward +
// backward, and backward alone (their difference), medians of CUDA-event timings; TFLOP/s on the GEMM flops (forward
// 4·M·H·F, backward 8·M·H·F; gated 1.5×); and the peak extra device memory of a forward + backward step: the most
// tapegrad held during it beyond what was held before (inputs and parameters), gradients included, as the peers'
// peak_extra_mib; and the forward + backward step captured once as a CUDA graph (tensor/gpu/graph.hpp) and replayed
// ("forward_backward_graph": one launch per step). Each configuration runs twice: with cuBLASLt's heuristic choice of
// GEMM algorithms ("gemm": "heuristic") and autotuned (cuda::set_gemm_autotune; "gemm": "autotuned"), and in each
// "precision": bf16 products, and fp8 with delayed scaling and with current scaling (TransformerEngine's defaults,
// HYBRID format) and with block scaling; delayed and current scaling also with a weight cache ("_cached": the
// micro-batches after the first, whose weights' codes the first made; they are held from step to step, so the peak
// counts them as it counts the parameters). Delayed scaling's state stays on the device, so its steps capture too (each
// replay's forward ends the previous step there). The fp8 steps are quantized at every shape (cuda::Fp8Dispatch::
// always), the fp8 path's own times, from which bench/fp8_dispatch_fit.py fits the dispatch's model; "fp8_pays" says
// what the default dispatch (where_it_pays) runs: this step where true, else the bf16 step. GPU_MLP_CONFIGS and
// GPU_MLP_PRECISIONS and GPU_MLP_GEMMS (names, comma separated) run only those configurations, precisions and GEMM
// choices.
#include <cstdlib>
#include <optional>
#include <string>

#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/cuda/settings.hpp"
#include "tapegrad/ops/fp8/gpu_dispatch.hpp"
#include "tapegrad/tensor/gpu/graph.hpp"
#include "gpu_mlp_block.hpp"
#include "gpu_timing.hpp"
#include "tapegrad/tapegrad.hpp"

namespace bench {

namespace {

using namespace tapegrad;

struct Config {
  const char* name;
  std::int64_t M, H, F;
  const char* kind;  // peer_bench.py's name for the block
  NormType norm;
  Activation activation;
  bool biases;
};
constexpr Config configs[] = {
    {"small", 256, 256, 1024, "ln_gelu", NormType::layernorm, Activation::gelu, true},
    {"gpt_1k", 4096, 1024, 4096, "ln_gelu", NormType::layernorm, Activation::gelu, true},
    {"gpt_4k", 8192, 4096, 16384, "ln_gelu", NormType::layernorm, Activation::gelu, true},
    {"llama_4k", 8192, 4096, 11008, "rms_swiglu", NormType::rmsnorm, Activation::swiglu, false},
    // gpt_1k with sizes that are no multiple of 8 (no peer runs it): how far from gpt_1k's time it falls.
    {"gpt_1k_odd", 4096, 1021, 4093, "ln_gelu", NormType::layernorm, Activation::gelu, true},
    // Mid shapes no peer runs, where fp8 must pay as well (M·H·F from 2^32 to 2^33.2):
    // hidden 768 with a 4x FFN, 512 tokens through hidden 2048, and a quarter of gpt_1k's tokens (2^32).
    {"gpt_768", 4096, 768, 3072, "ln_gelu", NormType::layernorm, Activation::gelu, true},
    {"short_2k", 512, 2048, 8192, "ln_gelu", NormType::layernorm, Activation::gelu, true},
    {"quarter_1k", 1024, 1024, 4096, "ln_gelu", NormType::layernorm, Activation::gelu, true},
};

struct Precision {
  const char* name;
  std::optional<fp8::Recipe> fp8;
  bool weight_cache = false;
};
const Precision precisions[] = {
    {"bf16", std::nullopt},
    {"fp8_delayed", fp8::DelayedScaling{}},
    {"fp8_current", fp8::CurrentScaling{}},
    {"fp8_block", fp8::BlockScaling{}},
    {"fp8_delayed_cached", fp8::DelayedScaling{}, true},
    {"fp8_current_cached", fp8::CurrentScaling{}, true},
};

void run_config(const Config& c, const Precision& precision, bool autotune) {
  cuda::set_gemm_autotune(autotune);
  const std::int64_t n = activation_width(c.activation);
  const GpuMLPBlock block(c.M, c.H, c.F, c.norm, c.activation, c.biases, precision.fp8, precision.weight_cache);
  const auto step = [&] { block.step(); };
  const std::vector<Timing> t = measure_gpu({[&] {
                                               (void)block.forward();
                                               Tape::active().clear();
                                             },
                                             step});
  const double peak_extra = peak_extra_mib(step);

  const cuda::Graph graph = cuda::Graph::capture(0, step);  // after the timed steps: kernels made, GEMMs chosen
  const Timing replayed = measure_gpu([&] { graph.replay(); });

  const double gemm_flops = (n == 2 ? 18.0 : 12.0) * double(c.M) * double(c.H) * double(c.F);
  const fp8::StepWork work = fp8::StepWork::layernorm_mlp(c.M, c.H, c.F, static_cast<int>(n));
  const bool pays = block.options.fp8 && fp8::pays_on_gpu(*block.options.fp8, work);  // the default dispatch's choice
  const Timing backward_alone{t[1].median_ns - t[0].median_ns, t[1].min_ns - t[0].min_ns, t[1].reps};
  const struct {
    const char* mode;
    const Timing* timing;
    double flops;
  } modes[] = {{"forward", &t[0], gemm_flops / 3},
               {"forward_backward", &t[1], gemm_flops},
               {"backward", &backward_alone, gemm_flops * 2 / 3},
               {"forward_backward_graph", &replayed, gemm_flops}};
  for (const auto& m : modes) {
    JsonLine line("gpu_layernorm_mlp");
    line.str("config", c.name)
        .num("M", double(c.M))
        .num("H", double(c.H))
        .num("F", double(c.F))
        .str("kind", c.kind)
        .str("gemm", autotune ? "autotuned" : "heuristic")
        .str("precision", precision.name)
        .str("mode", m.mode)
        .num("median_ms", m.timing->median_ns * 1e-6)
        .num("tflops", m.flops / m.timing->median_ns * 1e-3)
        .timing(*m.timing);
    if (std::string(m.mode) == "forward_backward") line.num("peak_extra_mib", peak_extra);
    if (block.options.fp8) line.num("fp8_pays", pays ? 1.0 : 0.0);
  }
}

// Whether `name` is in the comma-separated list of environment variable `variable` (every name where it is unset).
bool chosen(const char* variable, const std::string& name) {
  const char* list = std::getenv(variable);
  return !list || ("," + std::string(list) + ",").find("," + name + ",") != std::string::npos;
}

}  // namespace

void gpu_layernorm_mlp() {
  if (!gpu_available("gpu_layernorm_mlp")) return;
  cuda::set_fp8_dispatch(cuda::Fp8Dispatch::always);
  for (const bool autotune : {false, true}) {
    if (!chosen("GPU_MLP_GEMMS", autotune ? "autotuned" : "heuristic")) continue;
    for (const Config& c : configs) {
      for (const Precision& p : precisions) {
        if (chosen("GPU_MLP_CONFIGS", c.name) && chosen("GPU_MLP_PRECISIONS", p.name)) run_config(c, p, autotune);
      }
    }
  }
  cuda::set_gemm_autotune(false);
  cuda::set_fp8_dispatch(cuda::Fp8Dispatch::where_it_pays);
}

}  // namespace bench

// GPU: nn::dot_product_attention at issue 41's shapes, bf16, causal and not, in both layouts: bshd (JAX's) and bhsd
// (PyTorch SDPA's, whose rows of one head are contiguous), which bench/peer_attention.py times for the peers (PyTorch's
// SDPA with each backend forced, JAX's cudnn and xla implementations, each in its own layout) on the same shapes: the
// recorded forward (as in training) and the forward + backward step, medians of CUDA-event timings, TFLOP/s on
// bench/attention_step.hpp's count (forward 4·B·Hq·S²·D, the step 3.5× that, causal half), each mode's peak extra
// device memory and the kernels it ran (cuDNN's where they apply). A case that fails (out of memory, a shape a kernel
// does not take) reports the error on its line and the others still run. GEMMs and cuDNN's attention plans autotuned
// (cuda::set_gemm_autotune, cuda::set_attention_autotune).
#include "attention_step.hpp"
#include "gpu_timing.hpp"
#include "tapegrad/cuda/blaslt.hpp"

namespace bench {

namespace {

using namespace tapegrad;

JsonLine& describe(JsonLine& line, const AttentionShape& s, bool causal, nn::AttentionLayout layout) {
  return line.str("config", s.name)
      .shape({s.B, s.S, s.Hq, s.Hkv, s.D}, "b_s_hq_hkv_d")
      .num("causal", causal)
      .str("layout", layout == nn::AttentionLayout::bshd ? "bshd" : "bhsd")
      .str("dtype", "bf16");
}

void run_case(const AttentionShape& s, bool causal, nn::AttentionLayout layout) {
  const AttentionStep<bf16> attention(s, causal, Device::cuda(0), layout);
  const std::function<void()> runs[] = {[&] {
                                          (void)attention.forward();
                                          Tape::active().clear();
                                        },
                                        [&] { attention.step(); }};
  // Each mode's repetitions back to back, as the peers time them: taken in turns, a forward would start where a
  // whole step had just left the card's clocks.
  const Timing t[] = {measure_gpu(runs[0]), measure_gpu(runs[1])};
  const char* modes[] = {"forward", "forward_backward"};
  const nn::AttentionKernels kernels =
      nn::dot_product_attention_kernels(attention.q, attention.k, attention.v, attention.options);
  const double forward_flops = attention_forward_flops(s, causal);
  const double flops[] = {forward_flops, forward_flops * (1 + attention_backward_over_forward)};
  for (std::size_t m = 0; m < 2; ++m) {
    const double peak = peak_extra_mib(runs[m]);
    JsonLine line("gpu_attention");
    describe(line, s, causal, layout)
        .str("mode", modes[m])
        .str("kernels", m == 0 ? kernels.forward : kernels.backward)
        .num("median_ms", t[m].median_ns * 1e-6)
        .num("tflops", flops[m] / t[m].median_ns * 1e-3)
        .num("peak_extra_mib", peak)
        .timing(t[m]);
  }
}

}  // namespace

void gpu_attention() {
  if (!gpu_available("gpu_attention")) return;
  cuda::set_gemm_autotune(true);
  cuda::set_attention_autotune(true);
  for (const AttentionShape& s : issue_attention_shapes) {
    for (const bool causal : {false, true}) {
      for (const nn::AttentionLayout layout : {nn::AttentionLayout::bshd, nn::AttentionLayout::bhsd}) {
        if (const auto error = failure_of([&] { run_case(s, causal, layout); })) {  // e.g. a composite's S × S scores
          JsonLine line("gpu_attention");
          describe(line, s, causal, layout).str("error", *error);
        }
      }
    }
  }
  cuda::set_gemm_autotune(false);
  cuda::set_attention_autotune(false);
}

}  // namespace bench

// GPU: FP8 attention against bf16's on cuDNN's engines, the launchers alone (cuda/cudnn_attention.hpp: no tape, no
// quantization around them), at issue 41's head-dim-128 shapes and the TransformerLayer's (B 4, S 2048, 32 heads),
// bshd, causal and not: the forward and the forward + backward, medians of CUDA-event timings, TFLOP/s on
// bench/attention_step.hpp's count, and FP8's time over bf16's. Plans autotuned (cuda::set_attention_autotune). A case
// cuDNN refuses reports why on its line.
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention_step.hpp"
#include "gpu_timing.hpp"
#include "tapegrad/cuda/cudnn_attention.hpp"
#include "tapegrad/cuda/settings.hpp"
#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tapegrad.hpp"

namespace bench {

namespace {

using namespace tapegrad;

constexpr AttentionShape layer_shape{"layer_b4_s2k_h32_d128", 4, 2048, 32, 32, 128};

template <class T> Tensor<T> random_on_gpu(std::int64_t n, std::uint64_t seed) {
  return cast<T>(randn<float>({n}, seed)).to(Device::cuda(0));
}

attention::Problem problem_of(const AttentionShape& s, bool causal) {
  const attention::RowStrides q{.batch = s.S * s.Hq * s.D, .head = s.D, .row = s.Hq * s.D},
      kv{.batch = s.S * s.Hkv * s.D, .head = s.D, .row = s.Hkv * s.D};
  attention::Problem p{.batch = s.B, .q_heads = s.Hq, .kv_heads = s.Hkv, .Sq = s.S, .Sk = s.S, .D = s.D, .Dv = s.D,
                       .q = q, .k = kv, .v = kv, .o = q};
  p.scale = 1 / std::sqrt(static_cast<double>(s.D));
  p.causal = causal;
  return p;
}

// One precision's operands (bf16, or e4m3 with e5m2 gradients) and its forward and step.
template <class T, class G> struct Operands {
  std::int64_t nq, nkv;
  Tensor<T> q, k, v, o;
  Tensor<G> dout, dq, dk, dv;
  Tensor<float> log_sums, delta;
  Operands(const AttentionShape& s, std::uint64_t seed)
      : nq(s.B * s.S * s.Hq * s.D),
        nkv(s.B * s.S * s.Hkv * s.D),
        q(random_on_gpu<T>(nq, seed)),
        k(random_on_gpu<T>(nkv, seed + 1)),
        v(random_on_gpu<T>(nkv, seed + 2)),
        o(Shape{nq}, Device::cuda(0)),
        dout(random_on_gpu<G>(nq, seed + 3)),
        dq(Shape{nq}, Device::cuda(0)),
        dk(Shape{nkv}, Device::cuda(0)),
        dv(Shape{nkv}, Device::cuda(0)),
        log_sums(Shape{s.B * s.Hq * s.S}, Device::cuda(0)),
        delta(Shape{s.B * s.Hq * s.S}, Device::cuda(0)) {}
};

// FP8's scales, descales and amaxes, each on 16 bytes of its own: 1 but scale_s (P ≤ 1 fills e4m3's range).
struct Fp8Slots {
  Tensor<float> memory;
  cuda::Fp8AttentionScales scales;
  cuda::Fp8AttentionAmaxes amaxes;
  Fp8Slots() {
    Tensor<float> values = full<float>({4 * 32}, 1.0f);
    values.flat(4 * 3) = 448.0f;  // scale_s, then descale_s
    values.flat(4 * 4) = 1 / 448.0f;
    memory = values.to(Device::cuda(0));
    const auto at = [&](int i) { return memory.data() + 4 * i; };
    scales = {.descale_q = at(0), .descale_k = at(1), .descale_v = at(2), .scale_s = at(3), .descale_s = at(4),
              .scale_o = at(5), .descale_o = at(6), .descale_dout = at(7), .scale_dp = at(8),
              .descale_dp = at(9), .scale_dq = at(10), .scale_dk = at(11), .scale_dv = at(12)};
    amaxes = {.s = at(16), .o = at(17), .dp = at(18), .dq = at(19), .dk = at(20), .dv = at(21)};
  }
};

JsonLine& describe(JsonLine& line, const AttentionShape& s, bool causal) {
  return line.str("config", s.name).shape({s.B, s.S, s.Hq, s.Hkv, s.D}, "b_s_hq_hkv_d").num("causal", causal);
}

void run_case(const AttentionShape& s, bool causal) {
  const attention::Problem p = problem_of(s, causal);
  for (const bool backward : {false, true}) {
    const std::string refusal = cuda::cudnn_attention_fp8_refusal(p, backward, DType::f8e5m2, 0);
    if (!refusal.empty()) throw Error(detail::concat("cuDNN's FP8 attention: ", refusal));
  }
  Operands<bf16, bf16> b(s, 11);
  Operands<f8e4m3, f8e5m2> f(s, 11);
  const Fp8Slots slots;
  const auto queued = [](bool ran) { check(ran, "gpu_attention_fp8", "cuDNN did not take the case"); };
  const auto bf16_forward = [&] {
    queued(cuda::cudnn_attention_forward(DType::bf16, p, b.q.data(), b.k.data(), b.v.data(), b.o.data(),
                                         b.log_sums.data(), 0));
  };
  const auto fp8_forward = [&] {
    queued(cuda::cudnn_attention_fp8_forward(p, f.q.data(), f.k.data(), f.v.data(), f.o.data(), f.log_sums.data(),
                                             slots.scales, slots.amaxes, 0));
  };
  const std::function<void()> runs[] = {
      bf16_forward,
      [&] {
        bf16_forward();
        queued(cuda::cudnn_attention_backward(DType::bf16, p, b.q.data(), b.k.data(), b.v.data(), b.o.data(),
                                              b.log_sums.data(), b.dout.data(), b.delta.data(), b.dq.data(),
                                              b.dk.data(), b.dv.data(), 0));
      },
      fp8_forward,
      [&] {
        fp8_forward();
        queued(cuda::cudnn_attention_fp8_backward(p, DType::f8e5m2, f.q.data(), f.k.data(), f.v.data(), f.o.data(),
                                                  f.log_sums.data(), f.dout.data(), f.dq.data(), f.dk.data(),
                                                  f.dv.data(), slots.scales, slots.amaxes, 0));
      }};
  const double forward_flops = attention_forward_flops(s, causal);
  double bf16_ns[2] = {0, 0};
  for (int r = 0; r < 4; ++r) {  // each mode's repetitions back to back, as gpu_attention's
    const Timing t = measure_gpu(runs[r]);
    const bool step = r % 2 == 1, fp8 = r >= 2;
    if (!fp8) bf16_ns[r] = t.median_ns;
    JsonLine line("gpu_attention_fp8");
    describe(line, s, causal)
        .str("precision", fp8 ? "fp8" : "bf16")
        .str("mode", step ? "forward_backward" : "forward")
        .num("median_ms", t.median_ns * 1e-6)
        .num("tflops", forward_flops * (step ? 1 + attention_backward_over_forward : 1) / t.median_ns * 1e-3)
        .num("over_bf16", t.median_ns / bf16_ns[r % 2])
        .timing(t);
  }
}

}  // namespace

void gpu_attention_fp8() {
  if (!gpu_available("gpu_attention_fp8")) return;
  cuda::set_attention_autotune(true);
  std::vector<AttentionShape> shapes{layer_shape};
  for (const AttentionShape& s : issue_attention_shapes) {
    if (s.D == 128) shapes.push_back(s);  // (the FP8 backward's one head size on Hopper)
  }
  for (const AttentionShape& s : shapes) {
    for (const bool causal : {true, false}) {
      if (const auto error = failure_of([&] { run_case(s, causal); })) {
        JsonLine line("gpu_attention_fp8");
        describe(line, s, causal).str("error", *error);
      }
    }
  }
  cuda::set_attention_autotune(false);
}

}  // namespace bench

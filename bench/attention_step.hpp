// The attention the benchmarks time (bench/attention.cpp on the CPU, bench/gpu_attention.cpp on the GPU):
// nn::dot_product_attention of q [B, S, Hq, D], k and v [B, S, Hkv, D] (layout bshd, as the issue's shapes and JAX's
// native layout; or [B, heads, S, D], bhsd, PyTorch SDPA's), unit normal inputs and output gradient, and the FLOP
// count both report, the one bench/peer_attention.py uses for the peers.
#pragma once

#include <cstdint>

#include "tapegrad/tapegrad.hpp"

namespace bench {

struct AttentionShape {
  const char* name;
  std::int64_t B, S, Hq, Hkv, D;
};

// Issue 41's shapes, under the names peer_attention.py gives them.
inline constexpr AttentionShape issue_attention_shapes[] = {
    {"b4_s4k_h32_d128", 4, 4096, 32, 32, 128},  {"b2_s8k_h32_d128", 2, 8192, 32, 32, 128},
    {"b16_s1k_h16_d64", 16, 1024, 16, 16, 64},  {"b1_s16k_h8_d128", 1, 16384, 8, 8, 128},
    {"gqa_b4_s4k_h32_kv8_d128", 4, 4096, 32, 8, 128},
};

// The forward's two products, q·kᵀ and p·v: 4·B·Hq·S²·D; causal skips half of them.
inline double attention_forward_flops(const AttentionShape& s, bool causal) {
  return 4.0 * double(s.B) * double(s.Hq) * double(s.S) * double(s.S) * double(s.D) / (causal ? 2 : 1);
}
// The backward's five products (p recomputed, dv, dp, dq, dk) against the forward's two, as FlashAttention counts.
inline constexpr double attention_backward_over_forward = 2.5;

template <class T> struct AttentionStep {
  tapegrad::Var<T> q, k, v;
  tapegrad::Tensor<T> dy;
  tapegrad::nn::AttentionOptions options;

  AttentionStep(const AttentionShape& s, bool causal, tapegrad::Device device,
                tapegrad::nn::AttentionLayout layout = tapegrad::nn::AttentionLayout::bshd) {
    using namespace tapegrad;
    const bool bshd = layout == nn::AttentionLayout::bshd;
    const auto shape = [&](std::int64_t heads) {
      return bshd ? Shape{s.B, s.S, heads, s.D} : Shape{s.B, heads, s.S, s.D};
    };
    q = param(randn<T>(shape(s.Hq), 1, 0.0, 1.0, device));
    k = param(randn<T>(shape(s.Hkv), 2, 0.0, 1.0, device));
    v = param(randn<T>(shape(s.Hkv), 3, 0.0, 1.0, device));
    dy = randn<T>(shape(s.Hq), 4, 0.0, 1.0, device);
    options = {.causal = causal, .layout = layout};
  }

  // The recorded forward, as in training.
  tapegrad::Var<T> forward() const { return tapegrad::nn::dot_product_attention(q, k, v, options); }

  // One training step's work: forward, backward, the gradients dropped and the tape cleared.
  void step() const {
    tapegrad::backward(forward(), dy);
    for (tapegrad::Var<T> x : {q, k, v}) x.zero_grad();
    tapegrad::Tape::active().clear();
  }
};

}  // namespace bench

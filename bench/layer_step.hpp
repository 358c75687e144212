// The TransformerLayer training step the GPU benchmarks run (bench/gpu_transformer_layer.cpp times it,
// bench/transformer_layer_step.cpp runs one for ncu): nn::TransformerLayer<bf16>, pre-norm, causal attention,
// GELU (tanh), biases, LayerNorm epsilon 1e-5, x [B, S, H] and the output's gradient unit normal; one step is the
// forward and the backward into every parameter and x, the gradients then cleared. fp8: the recipe of the dense parts
// (qkv, out and the MLP's two GEMMs; the attention stays bf16).
#pragma once

#include <cstdint>
#include <optional>
#include <variant>

#include "attention_step.hpp"

namespace bench {

struct LayerShape {
  const char* name;  // peer_transformer_layer.py's
  std::int64_t B, S, H, heads, F;
};

// Forward GEMMs 2·tokens·(4·H² + 2·H·F) (qkv, out, the MLP's two), tripled by the backward; attention as
// attention_step.hpp counts it.
inline double layer_step_flops(const LayerShape& c) {
  const double tokens = double(c.B) * double(c.S), H = double(c.H);
  const AttentionShape attention{c.name, c.B, c.S, c.heads, c.heads, c.H / c.heads};
  return 3 * 2 * tokens * (4 * H * H + 2 * H * double(c.F)) +
         attention_forward_flops(attention, true) * (1 + attention_backward_over_forward);
}

class LayerStep {
 public:
  LayerStep(const LayerShape& c, const std::optional<tapegrad::fp8::Recipe>& fp8, tapegrad::Device device)
      : layer_(c.H,
               {.num_heads = c.heads,
                .ffn_dim = c.F,
                .activation = tapegrad::Activation::gelu,
                .norm = {.epsilon = 1e-5},
                .fp8 = fp8},
               0, device),
        x_(tapegrad::param(tapegrad::randn<tapegrad::bf16>({c.B, c.S, c.H}, 1, 0.0, 1.0, device))),
        dy_(tapegrad::randn<tapegrad::bf16>({c.B, c.S, c.H}, 2, 0.0, 1.0, device)),
        parameters_(layer_.parameters()) {}

  void operator()() const { backward(forward()); }
  // The step in its two halves (what the forward holds for the backward shows between them).
  tapegrad::Var<tapegrad::bf16> forward() const { return layer_(x_); }
  void backward(const tapegrad::Var<tapegrad::bf16>& y) const {
    tapegrad::backward(y, dy_);
    for (const tapegrad::nn::NamedParameter& p : parameters_) std::visit([](auto v) { v.zero_grad(); }, p.var);
    tapegrad::Var<tapegrad::bf16>(x_).zero_grad();
    tapegrad::Tape::active().clear();
  }

 private:
  tapegrad::nn::TransformerLayer<tapegrad::bf16> layer_;
  tapegrad::Var<tapegrad::bf16> x_;
  tapegrad::Tensor<tapegrad::bf16> dy_;
  tapegrad::nn::ParameterList parameters_;
};

}  // namespace bench

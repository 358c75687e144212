// nn::TransformerLayer: one transformer block, as TransformerEngine's TransformerLayer, over x [..., S, H]. Children:
//   attention    MultiHeadAttention: self-attention with the fused qkv projection and the fused attention node;
//   mlp          LayerNormMLP: the layernorm_mlp node (norm, GEMM, activation, GEMM);
//   output_norm  LayerNorm, with `output_norm` only.
// Pre-norm (the default): y = x + attention(norm(x)); out = y + mlp(norm(y)), each norm inside its child.
// With output_norm (post-norm, TransformerEngine's output_layernorm): the attention reads x itself and a norm
// follows the last residual: out = norm(y + mlp(norm(y))), y = x + attention(x).
//
//   nn::TransformerLayer<bf16> layer(1024, {.num_heads = 16, .ffn_dim = 4096, .rope = nn::RopeOptions{}}, 0);
//   Var<bf16> y = layer(x, {.dropout_seed = step});  // x [B, S, 1024], causal by default
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "tapegrad/ops/nn/attention.hpp"
#include "tapegrad/ops/nn/layer_norm.hpp"
#include "tapegrad/ops/nn/layer_norm_mlp.hpp"

namespace tapegrad::nn {

struct TransformerLayerConfig {
  std::int64_t num_heads = 0;     // must be set (> 0)
  std::int64_t num_kv_heads = 0;  // 0: num_heads; fewer: grouped-query attention
  std::int64_t head_dim = 0;      // 0: hidden / num_heads
  std::int64_t ffn_dim = 0;       // the MLP's intermediate size; must be set (> 0)
  Activation activation = Activation::gelu;
  LayerNormConfig norm{};         // every norm of the layer
  bool output_norm = false;       // post-norm, as above
  bool causal = true;
  std::int64_t window_left = -1, window_right = -1;
  double attention_dropout = 0;       // in calls that pass a dropout seed
  bool deterministic = false;         // the attention's GPU backward in the same bits every run
  std::optional<RopeOptions> rope{};  // rotary embeddings of q and k
  bool use_bias = true;
  Initializer kernel_init = Initializer::lecun_normal();
  Initializer bias_init = Initializer::zeros();
  Recompute recompute = Recompute::save_all;  // what the MLP node keeps for its backward
  std::optional<fp8::Recipe> fp8{};           // the dense parts: qkv, out and the MLP's two GEMMs
  // The attention's and the MLP's (MultiHeadAttentionConfig, LayerNormMLPConfig): x and the output replicated, or
  // sharded over their first axis with sequence_parallel (not with output_norm yet).
  std::optional<TensorParallel> tensor_parallel{};
};

namespace detail {
MultiHeadAttentionConfig attention_config(const TransformerLayerConfig& config);
LayerNormMLPConfig mlp_config(const TransformerLayerConfig& config);
}  // namespace detail

template <class P, class C = void>
  requires ModuleDtypes<P, C>
class TransformerLayer : public Module {
 public:
  TransformerLayer(std::int64_t hidden, TransformerLayerConfig config, std::uint64_t seed,
                   Device device = Device::cpu())
      : Module("TransformerLayer", device),
        config_(std::move(config)),
        attention_(hidden, detail::attention_config(config_), derive_seed(seed, "attention"), device),
        mlp_(hidden, detail::mlp_config(config_), derive_seed(seed, "mlp"), device) {
    add_child("attention", attention_);
    add_child("mlp", mlp_);
    if (config_.output_norm) {
      output_norm_ = std::make_unique<LayerNorm<P, C>>(hidden, config_.norm, derive_seed(seed, "output_norm"), device);
      add_child("output_norm", *output_norm_);
    }
  }

  // x [..., S, H] in any dtype -> [..., S, H] in the compute dtype.
  template <class T> Var<compute_of<C, T>> operator()(const Var<T>& x, const AttentionCall& call = {}) const {
    using U = compute_of<C, T>;
    return traced(
        [this, &call](const Var<T>& x) {
          const Var<U> residual = cast<U>(x);
          const Var<U> y = residual + attention_(x, call);
          const Var<U> out = mlp_(y);  // y + the MLP of y: the node adds the residual (mlp_config)
          return output_norm_ ? (*output_norm_)(out) : out;
        },
        x);
  }

  const TransformerLayerConfig& config() const { return config_; }
  const MultiHeadAttention<P, C>& attention() const { return attention_; }
  const LayerNormMLP<P, C>& mlp() const { return mlp_; }

 private:
  TransformerLayerConfig config_;
  MultiHeadAttention<P, C> attention_;
  LayerNormMLP<P, C> mlp_;
  std::unique_ptr<LayerNorm<P, C>> output_norm_;  // with output_norm
};

}  // namespace tapegrad::nn

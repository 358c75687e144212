// nn::MultiHeadAttention: self-attention over x [..., S, H] -> [..., S, H], the attention one fused node
// (nn::dot_product_attention_qkv). Children:
//   qkv  LayerNormDense (the input's norm, then the projection), or a Dense without `input_norm` (post-norm layers):
//        kernel [H, (heads + 2·kv_heads)·head_dim] whose columns run kv group by kv group, each group's q heads, then
//        its k head, then its v head (Megatron-LM's layout: a block of whole groups is what a tensor-parallel rank
//        holds), so one GEMM makes all three and the attention reads them in place;
//   out  Dense: [heads·head_dim, H], the projection of the merged heads back to H.
// Each head attends with softmax(q·kᵀ/√head_dim)·v; `causal` keeps query i from attending to keys j > i; with
// fewer kv heads (grouped-query attention) a kv head serves heads / kv_heads q heads; `rope` turns q and k first.
//
//   nn::MultiHeadAttention<bf16> attn(128, {.num_heads = 8, .num_kv_heads = 2, .causal = true, .rope = {{}}}, 0);
//   Var<bf16> y = attn(x);                                    // x [B, S, 128] -> [B, S, 128]
//   Var<bf16> y_train = attn(x, {.dropout_seed = step});      // with config.dropout on the probabilities
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "tapegrad/ops/attention.hpp"
#include "tapegrad/ops/nn/dense.hpp"
#include "tapegrad/ops/nn/layer_norm_dense.hpp"
#include "tapegrad/ops/rope.hpp"

namespace tapegrad::nn {

struct MultiHeadAttentionConfig {
  std::int64_t num_heads = 0;     // must be set (> 0)
  std::int64_t num_kv_heads = 0;  // 0: num_heads; fewer, dividing it: grouped-query (1: multi-query) attention
  std::int64_t head_dim = 0;      // 0: hidden / num_heads (which must then divide)
  bool causal = false;
  std::int64_t window_left = -1, window_right = -1;  // a sliding window (dot_product_attention's)
  double dropout = 0;                 // on the probabilities, in calls that pass a dropout seed
  bool deterministic = false;         // the GPU backward in the same bits every run (dot_product_attention's)
  std::optional<RopeOptions> rope{};  // rotary embeddings of q and k (the module sets layout and which heads turn)
  bool input_norm = true;             // false: the qkv projection is a Dense of x itself
  bool use_bias = true;               // biases of the qkv and out projections
  LayerNormConfig norm{};             // the input's norm
  Initializer kernel_init = Initializer::lecun_normal();
  Initializer bias_init = Initializer::zeros();
  std::optional<fp8::Recipe> fp8{};   // the two projections' products
  // Each rank holds whole kv groups (kv_heads / ranks of them, with their q heads): the qkv projection column-parallel,
  // the out projection row-parallel (nn::Dense's modes); x and the output replicated, or sharded over their first
  // axis with sequence_parallel (attention then sees the whole batch: `AttentionCall::lengths` are the whole
  // batch's). Dropout draws per rank (its seed derived from the rank), not a single process's mask.
  std::optional<TensorParallel> tensor_parallel{};
};

// What may change from call to call.
struct AttentionCall {
  std::optional<std::uint64_t> dropout_seed{};  // dropout runs in the calls that give one (a fresh seed each step)
  std::vector<std::int64_t> lengths{};          // per batch element, its valid tokens (padding at the end)
  std::int64_t position_offset = 0;             // rope's position of the first token
};

namespace detail {
// The config with head_dim and num_kv_heads filled in; throws naming the sizes when they do not fit.
MultiHeadAttentionConfig resolve_attention(std::int64_t hidden, MultiHeadAttentionConfig config);
DenseConfig qkv_config(const MultiHeadAttentionConfig& config);
DenseConfig out_config(std::int64_t hidden, const MultiHeadAttentionConfig& config);
// qkv [..., S, (heads + 2·kv_heads)·head_dim] -> every head's attention, heads merged: [..., S, heads·head_dim]
// (with tensor parallelism: this rank's heads).
template <class U>
Var<U> attend_heads(const Var<U>& qkv, const MultiHeadAttentionConfig& config, const AttentionCall& call);
}  // namespace detail

template <class P, class C = void>
  requires ModuleDtypes<P, C>
class MultiHeadAttention : public Module {
 public:
  MultiHeadAttention(std::int64_t hidden, MultiHeadAttentionConfig config, std::uint64_t seed,
                     Device device = Device::cpu())
      : Module("MultiHeadAttention", device),
        hidden_(hidden),
        config_(detail::resolve_attention(hidden, std::move(config))),
        out_(config_.num_heads * config_.head_dim, detail::out_config(hidden, config_), derive_seed(seed, "out"),
             device) {
    const std::uint64_t qkv_seed = derive_seed(seed, "qkv");
    if (config_.input_norm) {
      normed_qkv_ = std::make_unique<LayerNormDense<P, C>>(
          hidden, LayerNormDenseConfig{.dense = detail::qkv_config(config_), .norm = config_.norm}, qkv_seed, device);
      add_child("qkv", *normed_qkv_);
    } else {
      plain_qkv_ = std::make_unique<Dense<P, C>>(hidden, detail::qkv_config(config_), qkv_seed, device);
      add_child("qkv", *plain_qkv_);
    }
    add_child("out", out_);
  }

  // x [..., S, H] in any dtype -> [..., S, H] in the compute dtype.
  template <class T> Var<compute_of<C, T>> operator()(const Var<T>& x, const AttentionCall& call = {}) const {
    return traced(
        [this, &call](const Var<T>& x) {
          check_input(x.shape(), hidden_, 2);
          const Var<compute_of<C, T>> qkv = normed_qkv_ ? (*normed_qkv_)(x) : (*plain_qkv_)(x);
          return out_(detail::attend_heads(qkv, config_, call));
        },
        x);
  }

  const MultiHeadAttentionConfig& config() const { return config_; }  // head_dim and num_kv_heads resolved
  const Module& qkv() const { return normed_qkv_ ? static_cast<const Module&>(*normed_qkv_) : *plain_qkv_; }
  const Dense<P, C>& out() const { return out_; }

 private:
  std::int64_t hidden_;
  MultiHeadAttentionConfig config_;
  std::unique_ptr<LayerNormDense<P, C>> normed_qkv_;  // with input_norm
  std::unique_ptr<Dense<P, C>> plain_qkv_;            // without
  Dense<P, C> out_;
};

}  // namespace tapegrad::nn

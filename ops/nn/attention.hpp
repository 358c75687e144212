// nn::MultiHeadAttention: pre-norm self-attention over x [..., S, H] -> [..., S, H]. Children:
//   qkv  LayerNormDense: the input's norm and the fused q/k/v projection, kernel [H, 3·heads·head_dim] whose columns
//        are q | k | v, each heads × head_dim (head-major), so one GEMM makes all three;
//   out  Dense: [heads·head_dim, H], the projection of the merged heads back to H.
// Each head attends with softmax(q·kᵀ/√head_dim)·v; `causal` keeps query i from attending to keys j > i.
//
//   nn::MultiHeadAttention<bf16> attn(128, {.num_heads = 8, .head_dim = 16, .causal = true}, /*seed=*/0);
//   Var<bf16> y = attn(x);  // x [B, S, 128] -> [B, S, 128]
#pragma once

#include <cstdint>

#include "tapegrad/ops/nn/dense.hpp"
#include "tapegrad/ops/attention.hpp"
#include "tapegrad/ops/nn/layer_norm_dense.hpp"

namespace tapegrad::nn {

struct MultiHeadAttentionConfig {
  std::int64_t num_heads = 0;  // must be set (> 0)
  std::int64_t head_dim = 0;   // 0: hidden / num_heads (which must then divide)
  bool causal = false;
  bool use_bias = true;      // biases of the qkv and out projections
  LayerNormConfig norm{};    // the input's norm
  Initializer kernel_init = Initializer::lecun_normal();
  Initializer bias_init = Initializer::zeros();
};

namespace detail {
// The config with head_dim filled in; throws naming the sizes when they do not fit.
MultiHeadAttentionConfig resolve_attention(std::int64_t hidden, MultiHeadAttentionConfig config);
LayerNormDenseConfig qkv_config(const MultiHeadAttentionConfig& config);
DenseConfig out_config(std::int64_t hidden, const MultiHeadAttentionConfig& config);
// qkv [..., S, 3·heads·head_dim] -> every head's attention, heads merged back: [..., S, heads·head_dim].
template <class U>
Var<U> attend_heads(const Var<U>& qkv, std::int64_t heads, std::int64_t head_dim, bool causal);
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
        qkv_(hidden, detail::qkv_config(config_), derive_seed(seed, "qkv"), device),
        out_(config_.num_heads * config_.head_dim, detail::out_config(hidden, config_), derive_seed(seed, "out"),
             device) {
    add_child("qkv", qkv_);
    add_child("out", out_);
  }

  // x [..., S, H] in any dtype -> [..., S, H] in the compute dtype.
  template <class T> Var<compute_of<C, T>> operator()(const Var<T>& x) const {
    return traced(
        [this](const Var<T>& x) {
          check_input(x.shape(), hidden_, 2);
          const auto heads = detail::attend_heads(qkv_(x), config_.num_heads, config_.head_dim, config_.causal);
          return out_(heads);
        },
        x);
  }

  const MultiHeadAttentionConfig& config() const { return config_; }  // head_dim resolved
  const LayerNormDense<P, C>& qkv() const { return qkv_; }
  const Dense<P, C>& out() const { return out_; }

 private:
  std::int64_t hidden_;
  MultiHeadAttentionConfig config_;
  LayerNormDense<P, C> qkv_;
  Dense<P, C> out_;
};

}  // namespace tapegrad::nn

#include "tapegrad/ops/nn/attention.hpp"

#include "tapegrad/ops/layout.hpp"

namespace tapegrad::nn {

namespace detail {

MultiHeadAttentionConfig resolve_attention(std::int64_t hidden, MultiHeadAttentionConfig config) {
  check(hidden > 0 && config.num_heads > 0, "MultiHeadAttention", "hidden size and num_heads must be positive, got ",
        hidden, " and ", config.num_heads);
  if (config.head_dim == 0) {
    check(hidden % config.num_heads == 0, "MultiHeadAttention", "hidden size ", hidden,
          " is not divisible by num_heads ", config.num_heads, "; set head_dim to choose the head size");
    config.head_dim = hidden / config.num_heads;
  }
  check(config.head_dim > 0, "MultiHeadAttention", "head_dim must be positive (or 0 for hidden / num_heads), got ",
        config.head_dim);
  if (config.num_kv_heads == 0) config.num_kv_heads = config.num_heads;
  check(config.num_kv_heads > 0 && config.num_heads % config.num_kv_heads == 0, "MultiHeadAttention",
        "num_kv_heads ", config.num_kv_heads, " must divide num_heads ", config.num_heads);
  return config;
}

DenseConfig qkv_config(const MultiHeadAttentionConfig& config) {
  return {.features = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim,
          .use_bias = config.use_bias,
          .kernel_init = config.kernel_init,
          .bias_init = config.bias_init,
          .fp8 = config.fp8};
}

DenseConfig out_config(std::int64_t hidden, const MultiHeadAttentionConfig& config) {
  return {.features = hidden, .use_bias = config.use_bias, .kernel_init = config.kernel_init,
          .bias_init = config.bias_init, .fp8 = config.fp8};
}

template <class U>
Var<U> attend_heads(const Var<U>& qkv, const MultiHeadAttentionConfig& config, const AttentionCall& call) {
  const std::int64_t heads = config.num_heads, kv_heads = config.num_kv_heads, D = config.head_dim;
  Var<U> rows = qkv;
  if (config.rope) {
    // The projection's rows seen as [..., S, heads + 2·kv_heads, D] (a view): q's and k's heads turn, v's are copied.
    std::vector<std::int64_t> dims = qkv.shape().to_vector();
    dims.back() = heads + 2 * kv_heads;
    dims.push_back(D);
    RopeOptions rope = *config.rope;
    rope.layout = AttentionLayout::bshd;
    rope.rotated_heads = heads + kv_heads;
    rope.position_offset += call.position_offset;
    rows = reshape(nn::rope(reshape(qkv, dims), rope), qkv.shape().to_vector());
  }
  return dot_product_attention_qkv(rows, heads, kv_heads,
                                   {.causal = config.causal,
                                    .window_left = config.window_left,
                                    .window_right = config.window_right,
                                    .q_lengths = call.lengths,
                                    .kv_lengths = call.lengths,
                                    .dropout = call.dropout_seed ? config.dropout : 0.0,
                                    .dropout_seed = call.dropout_seed.value_or(0)});
}

}  // namespace detail

#define TAPEGRAD_INSTANTIATE_ATTENTION(U)                                                                             \
  template Var<U> detail::attend_heads<U>(const Var<U>&, const MultiHeadAttentionConfig&, const AttentionCall&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_ATTENTION)

}  // namespace tapegrad::nn

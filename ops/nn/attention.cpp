#include "tapegrad/ops/nn/attention.hpp"

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
  return config;
}

LayerNormDenseConfig qkv_config(const MultiHeadAttentionConfig& config) {
  return {.dense = {.features = 3 * config.num_heads * config.head_dim,
                    .use_bias = config.use_bias,
                    .kernel_init = config.kernel_init,
                    .bias_init = config.bias_init},
          .norm = config.norm};
}

DenseConfig out_config(std::int64_t hidden, const MultiHeadAttentionConfig& config) {
  return {.features = hidden, .use_bias = config.use_bias, .kernel_init = config.kernel_init,
          .bias_init = config.bias_init};
}

template <class U>
Var<U> attend_heads(const Var<U>& qkv, std::int64_t heads, std::int64_t head_dim, bool causal) {
  const Shape& shape = qkv.shape();
  const std::int64_t width = heads * head_dim;
  check(shape.rank() >= 2 && shape.dim(-1) == 3 * width, "MultiHeadAttention", "the qkv projection has shape ",
        shape, " but ", heads, " heads of size ", head_dim, " need [..., S, ", 3 * width, "]");
  return dot_product_attention_qkv(qkv, heads, heads, {.causal = causal});
}

}  // namespace detail

#define TAPEGRAD_INSTANTIATE_ATTENTION(U)                                                                  \
  template Var<U> detail::attend_heads<U>(const Var<U>&, std::int64_t, std::int64_t, bool);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_ATTENTION)

}  // namespace tapegrad::nn

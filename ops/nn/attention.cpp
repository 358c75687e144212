#include "tapegrad/ops/nn/attention.hpp"

#include <string>

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
  if (config.tensor_parallel) {
    const int ranks = config.tensor_parallel->comm.size();
    check(config.num_kv_heads % ranks == 0, "MultiHeadAttention", "tensor parallelism over ", ranks,
          " ranks needs whole kv groups on each: num_kv_heads ", config.num_kv_heads, " is not a multiple");
  }
  return config;
}

namespace {
// A projection of `features` outputs with the config's bias, initializers, fp8 and tensor-parallel mode.
DenseConfig projection(const MultiHeadAttentionConfig& config, std::int64_t features, DenseConfig::Parallel mode) {
  return {.features = features,
          .use_bias = config.use_bias,
          .kernel_init = config.kernel_init,
          .bias_init = config.bias_init,
          .fp8 = config.fp8,
          .tensor_parallel = config.tensor_parallel,
          .parallel = mode};
}
}  // namespace

DenseConfig qkv_config(const MultiHeadAttentionConfig& config) {
  return projection(config, (config.num_heads + 2 * config.num_kv_heads) * config.head_dim,
                    DenseConfig::Parallel::column);
}

DenseConfig out_config(std::int64_t hidden, const MultiHeadAttentionConfig& config) {
  return projection(config, hidden, DenseConfig::Parallel::row);
}

template <class U>
Var<U> attend_heads(const Var<U>& qkv, const MultiHeadAttentionConfig& config, const AttentionCall& call) {
  const int ranks = config.tensor_parallel ? config.tensor_parallel->comm.size() : 1;
  const std::int64_t heads = config.num_heads / ranks, kv_heads = config.num_kv_heads / ranks, D = config.head_dim;
  const std::int64_t group = heads / kv_heads;
  std::uint64_t dropout_seed = call.dropout_seed.value_or(0);
  if (config.tensor_parallel) {  // each rank draws for its own heads, from a seed of its own
    dropout_seed = derive_seed(dropout_seed, "rank" + std::to_string(config.tensor_parallel->comm.rank()));
  }
  Var<U> rows = qkv;
  if (config.rope) {
    // The projection's rows seen as [..., S, heads + 2·kv_heads, D] (a view), kv group by kv group: in each group
    // the q heads and the k head turn, the v head is copied.
    std::vector<std::int64_t> dims = qkv.shape().to_vector();
    dims.back() = heads + 2 * kv_heads;
    dims.push_back(D);
    RopeOptions rope = *config.rope;
    rope.layout = AttentionLayout::bshd;
    rope.rotated_heads = group + 1;
    rope.head_period = group + 2;
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
                                    .dropout_seed = dropout_seed,
                                    .packing = QkvPacking::groups,
                                    .deterministic = config.deterministic});
}

}  // namespace detail

#define TAPEGRAD_INSTANTIATE_ATTENTION(U)                                                                             \
  template Var<U> detail::attend_heads<U>(const Var<U>&, const MultiHeadAttentionConfig&, const AttentionCall&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_ATTENTION)

}  // namespace tapegrad::nn

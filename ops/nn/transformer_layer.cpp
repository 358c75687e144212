#include "tapegrad/ops/nn/transformer_layer.hpp"

namespace tapegrad::nn::detail {

MultiHeadAttentionConfig attention_config(const TransformerLayerConfig& config) {
  return {.num_heads = config.num_heads,
          .num_kv_heads = config.num_kv_heads,
          .head_dim = config.head_dim,
          .causal = config.causal,
          .window_left = config.window_left,
          .window_right = config.window_right,
          .dropout = config.attention_dropout,
          .deterministic = config.deterministic,
          .rope = config.rope,
          .input_norm = !config.output_norm,
          .use_bias = config.use_bias,
          .norm = config.norm,
          .kernel_init = config.kernel_init,
          .bias_init = config.bias_init,
          .fp8 = config.fp8,
          .tensor_parallel = config.tensor_parallel};
}

LayerNormMLPConfig mlp_config(const TransformerLayerConfig& config) {
  check(config.ffn_dim > 0, "TransformerLayer", "ffn_dim must be positive, got ", config.ffn_dim);
  check(!(config.output_norm && config.tensor_parallel && config.tensor_parallel->sequence_parallel),
        "TransformerLayer", "output_norm with sequence_parallel is not supported yet");
  return {.intermediate_dim = config.ffn_dim,
          .activation = config.activation,
          .norm = config.norm,
          .use_bias = config.use_bias,
          .kernel_init = config.kernel_init,
          .bias_init = config.bias_init,
          .recompute = config.recompute,
          .residual = true,  // y + mlp(y) in the node: no pass for the add, none for its gradient
          .fp8 = config.fp8,
          .tensor_parallel = config.tensor_parallel};
}

}  // namespace tapegrad::nn::detail

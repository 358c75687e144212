// dot_product_attention and rope on the GPU against the cpu in double (tests/gpu_reference.hpp), forward and every
// gradient. Until the GPU has fused attention kernels its attention is the composite of recorded ops, so this checks
// that the masks, the bias and dropout's draws are the same on both devices; rope runs cuda/rope.cu.
#include <doctest/doctest.h>

#include <vector>

#include "gpu_reference.hpp"

using namespace tapegrad;
using test::check_against_cpu;
using test::Tolerance;

// The attention composite is a chain of ops; rope rounds each output once from f32 products.
template <class T> constexpr Tolerance tolerance = test::chain_tolerance<T>;

// 7 queries and keys, not a multiple of 8; grouped-query heads, a broadcast bias, key padding, a window, dropout.
TEST_CASE_TEMPLATE("dot_product_attention's options on the GPU match the cpu in double", T, TAPEGRAD_GPU_DTYPES) {
  using nn::AttentionLayout;
  const std::vector<nn::AttentionOptions> cases{
      {.layout = AttentionLayout::bshd},
      {.causal = true, .layout = AttentionLayout::bshd},
      {.causal = true, .window_left = 2, .kv_lengths = {7, 4}, .dropout = 0.2, .dropout_seed = 3,
       .layout = AttentionLayout::bshd},
  };
  for (std::size_t c = 0; c < cases.size(); ++c) {
    CAPTURE(c);
    check_against_cpu<T>(
        "dot_product_attention",
        [&](const auto& v) { return nn::dot_product_attention(v[0], v[1], v[2], cases[c], v[3]); },
        {{{2, 7, 4, 16}}, {{2, 7, 2, 16}}, {{2, 7, 2, 5}}, {{1, 4, 7, 7}}}, tolerance<T>, 3);
  }
}

TEST_CASE_TEMPLATE("dot_product_attention_qkv on the GPU matches the cpu in double", T, TAPEGRAD_GPU_DTYPES) {
  check_against_cpu<T>(
      "dot_product_attention_qkv",
      [](const auto& v) { return nn::dot_product_attention_qkv(v[0], 4, 2, {.causal = true}); },
      {{{2, 9, 8 * 12}}}, tolerance<T>, 4);
}

// Rows of odd head size and a partial rotary dimension, heads left unturned, both pairings and layouts.
TEST_CASE_TEMPLATE("rope on the GPU matches the cpu in double", T, TAPEGRAD_GPU_DTYPES) {
  const std::vector<nn::RopeOptions> cases{
      {},
      {.interleaved = true, .position_offset = 40},
      {.rotary_dim = 6, .rotated_heads = 2},
      {.rotary_dim = 4, .layout = nn::AttentionLayout::bhsd},
  };
  for (std::size_t c = 0; c < cases.size(); ++c) {
    CAPTURE(c);
    const Shape shape = c == 2 ? Shape{2, 33, 3, 9} : Shape{2, 33, 3, 10};
    check_against_cpu<T>("rope", [&](const auto& v) { return nn::rope(v[0], cases[c]); }, {{shape}}, tolerance<T>,
                         5);
  }
}

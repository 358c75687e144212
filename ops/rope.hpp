// nn::rope: rotary position embeddings (RoFormer) as one node, on q and k before attention. Pair i of a head's
// features turns by the angle position·base^(-2i/rotary_dim); the pairs are (i, i + rotary_dim/2) as in Llama and
// GPT-NeoX, or (2i, 2i+1) as in GPT-J with `interleaved`. The backward turns the gradient back (a rotation's
// transpose), so rope is differentiable to any order. In nn::, with dot_product_attention.
//
//   Var<bf16> q_rotated = nn::rope(q, {.rotary_dim = 64});         // q [B, S, heads, 128]: the first 64 features turn
//   // a fused projection's rows [B, S, (32 + 2·8)·128] by blocks: turn q's and k's 40 heads, copy v's 8
//   Var<bf16> qkv_rotated = nn::rope(reshape(qkv, {B, S, 48, 128}), {.rotated_heads = 40});
//   // by kv groups (4 q heads, k, v): in each period of 6 heads, turn the first 5
//   Var<bf16> grouped_rotated = nn::rope(reshape(qkv, {B, S, 48, 128}), {.rotated_heads = 5, .head_period = 6});
#pragma once

#include <cstdint>

#include "tapegrad/autodiff/var.hpp"
#include "tapegrad/ops/attention.hpp"

namespace tapegrad::nn {

struct RopeOptions {
  double base = 10000;
  std::int64_t rotary_dim = 0;        // the features of a head that turn, even and <= D; 0: all of them (D even)
  bool interleaved = false;           // pairs (2i, 2i+1) instead of (i, i + rotary_dim/2)
  std::int64_t position_offset = 0;   // the position of the first token (decoding after a prefix)
  std::int64_t rotated_heads = -1;    // only the first n heads (of each period) turn, the others are copied; -1: all
  std::int64_t head_period = 0;       // heads repeat in periods of this many (a projection packed by groups); 0: all
  AttentionLayout layout = AttentionLayout::bshd;  // x [..., S, heads, D], or [..., heads, S, D]
};

template <class U> Var<U> rope(const Var<U>& x, const RopeOptions& options = {});

}  // namespace tapegrad::nn

// The problem a fused attention kernel solves (nn::dot_product_attention, ops/attention.cpp), and the
// rules that say which keys a query sees and which probabilities dropout keeps: plain C++ that the CPU kernels and
// the CUDA ones both compile, so that a mask or a dropout draw is the same on every device.
//
// Each of q, k, v, o is a set of rows of D (Dv) contiguous elements: row s of head h of batch b starts at element
// offset + b·batch + h·head + (h / group)·group_skip + s·row of its tensor. The layouts ([B, H, S, D], [B, S, H, D],
// q, k and v packed in one projection, by blocks or by kv groups) are these strides; the gradients are written with
// their input's strides.
#pragma once

#include <cstdint>

#include "tapegrad/tensor/core/detail/host_device.hpp"
#include "tapegrad/tensor/core/detail/philox.hpp"

namespace tapegrad::attention {

struct RowStrides {
  std::int64_t offset = 0, batch = 0, head = 0, row = 0;
  std::int64_t group = 1, group_skip = 0;  // q's heads packed by kv group skip the group's k and v after each group

  TAPEGRAD_HOST_DEVICE std::int64_t at(std::int64_t b, std::int64_t h, std::int64_t s) const {
    return offset + b * batch + h * head + (h / group) * group_skip + s * row;
  }
};

struct Problem {
  std::int64_t batch = 0, q_heads = 0, kv_heads = 0, Sq = 0, Sk = 0, D = 0, Dv = 0;
  RowStrides q, k, v, o;  // o: the output and its gradient
  double scale = 1;
  // Query i of batch b sees keys [begin, end) of key_range. The diagonal is key i + Sk_b - Sq_b when bottom_right
  // (FlashAttention-2), key i otherwise (top-left); -1 leaves a side of the window open.
  bool causal = false, bottom_right = true;
  std::int64_t window_left = -1, window_right = -1;
  // [batch] valid queries (Sq_b) and keys (Sk_b), in the memory of the kernels' device; null: Sq and Sk.
  const std::int64_t* q_lengths = nullptr;
  const std::int64_t* kv_lengths = nullptr;
  // An additive bias [Bb, Hb, Sq, Sk] (Bb ∈ {1, batch}, Hb ∈ {1, q_heads}): its strides are 0 along broadcast axes.
  bool has_bias = false;
  std::int64_t bias_batch = 0, bias_head = 0;
  // Dropout on the probabilities: kept ones scaled by 1 / (1 - dropout).
  double dropout = 0;
  std::uint64_t dropout_seed = 0;
  // Whether a query within its batch's length sees no key (it gets zeros): only kernels that give such rows zeros
  // take the problem (tapegrad's; cuDNN's would give NaN). Set by the op, which knows the lengths on the host.
  bool queries_without_keys = false;
  // Whether the backward must give the same bits every run (tapegrad's kernels always do; cuDNN's fastest backward
  // sums dq in a varying order).
  bool deterministic = false;

  TAPEGRAD_HOST_DEVICE std::int64_t kv_head(std::int64_t h) const { return h / (q_heads / kv_heads); }
  TAPEGRAD_HOST_DEVICE std::int64_t bias_at(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return b * bias_batch + h * bias_head + i * Sk;
  }

  TAPEGRAD_HOST_DEVICE void key_range(std::int64_t b, std::int64_t i, std::int64_t& begin, std::int64_t& end) const {
    const std::int64_t queries = q_lengths ? q_lengths[b] : Sq, keys = kv_lengths ? kv_lengths[b] : Sk;
    begin = 0;
    end = i < queries ? keys : 0;
    const std::int64_t diagonal = bottom_right ? i + keys - queries : i;
    if (causal && end > diagonal + 1) end = diagonal + 1;
    if (window_right >= 0 && end > diagonal + window_right + 1) end = diagonal + window_right + 1;
    if (window_left >= 0 && diagonal - window_left > begin) begin = diagonal - window_left;
    if (end < begin) end = begin;
  }

  // Dropout's draw for probability (b, h, i, j): the uniform number of that flat index in [batch, q_heads, Sq, Sk]
  // under the seed (rand_uniform's), so that a tensor of them made by the factories shows the mask.
  TAPEGRAD_HOST_DEVICE bool kept(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    const std::uint64_t index = static_cast<std::uint64_t>(((b * q_heads + h) * Sq + i) * Sk + j);
    return philox::uniform(dropout_seed, index) >= dropout;
  }
};

}  // namespace tapegrad::attention

// The scaled-dot-product-attention graphs of cuDNN 9, forward and backward, written out as cudnn-frontend expands
// them (its CompositeSDPANode and CompositeSDPABackwardNode): cuDNN's fused engines recognize a graph by its shape,
// so the order of the operations, the types of the intermediate tensors, k and v described transposed and the
// probabilities cast to the I/O type before their product are all as the frontend writes them. The forward keeps
// each row's log-sum-exp (cuDNN's "stats": the natural log of the scaled, masked scores' sum, f32 [B, Hq, Sq]), which
// is what tapegrad's kernels save too: a forward on one engine and a backward on the other agree.
#pragma once

#include <cstdint>

#include "tapegrad/cuda/cudnn_graph.hpp"
#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda::cudnn {

// The uids the graphs' tensors are bound by at execution.
enum SdpaUid : std::int64_t {
  q_uid = 1, k_uid, v_uid, o_uid, stats_uid, scale_uid, minus_inf_uid, q_length_uid, kv_length_uid, right_bound_uid,
  left_bound_uid, dout_uid, dq_uid, dk_uid, dv_uid, one_uid, softmax_sum_uid, dq_sum_uid, q_lengths_uid,
  kv_lengths_uid, left_window_uid
};

// Everything a graph and its plan depend on: sizes, the strides [batch, head, row, element] of q, k, v and o, the
// masks, and the device (plans are compiled per device).
struct SdpaKey {
  bool backward = false;
  int device = 0;
  DType dtype{};
  std::int64_t batch = 0, q_heads = 0, kv_heads = 0, Sq = 0, Sk = 0, D = 0, Dv = 0;
  Dims q, k, v, o;
  // The keys a query sees: up to its diagonal + right_bound, from its diagonal - left_bound (-1: that side open);
  // bottom_right: the diagonal moved by Sk - Sq.
  std::int64_t right_bound = -1, left_bound = -1;
  bool bottom_right = false, deterministic = false;
  bool padding = false;  // per-batch lengths: each batch element's valid queries and keys
  auto operator<=>(const SdpaKey&) const = default;
};

Graph sdpa_forward_graph(const SdpaKey& key);
Graph sdpa_backward_graph(const SdpaKey& key);

}  // namespace tapegrad::cuda::cudnn

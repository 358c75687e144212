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
  kv_lengths_uid, left_window_uid,
  // The FP8 graphs' scales, descales (1 / scale) and amaxes, f32 [1] in device memory.
  descale_q_uid, descale_k_uid, descale_v_uid, descale_s_uid, scale_s_uid, scale_o_uid, amax_s_uid, amax_o_uid,
  descale_o_uid, descale_dout_uid, descale_dp_uid, scale_dp_uid, scale_dq_uid, scale_dk_uid, scale_dv_uid,
  amax_dp_uid, amax_dq_uid, amax_dk_uid, amax_dv_uid
};

// Everything a graph and its plan depend on: sizes, the strides [batch, head, row, element] of q, k, v and o, the
// masks, and the device (plans are compiled per device).
struct SdpaKey {
  bool backward = false;
  int device = 0;
  DType dtype{};  // q, k, v and o: bf16, f16, or f8e4m3 for the FP8 graphs
  DType gradient_dtype{};  // the FP8 backward's dout, dq, dk and dv: f8e5m2 (the hybrid format) or f8e4m3
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

// The FP8 graphs (cudnn-frontend's with FP8 operands, TransformerEngine's fused FP8 attention): q, k, v, o and the
// probabilities' copy the second product reads in e4m3, each product's operands descaled in f32 after it, its
// result's amax taken before it is scaled into its FP8 output. The forward also gives the probabilities' amax
// (amax_s) and keeps the same log-sum-exp as bf16's; the backward quantizes the probabilities with the forward's
// scale_s again and the scores' gradient (dS, with the attention scale) with scale_dp, whose amax it gives.
Graph sdpa_fp8_forward_graph(const SdpaKey& key);
Graph sdpa_fp8_backward_graph(const SdpaKey& key);

}  // namespace tapegrad::cuda::cudnn

// The SDPA graphs (cudnn_sdpa.hpp), operation by operation as cudnn-frontend emits them.
#include "tapegrad/cuda/cudnn_sdpa.hpp"

#include "tapegrad/cuda/detail/cudnn_sdpa_parts.hpp"

namespace tapegrad::cuda::cudnn {

namespace {

using namespace sdpa;
using Key = SdpaKey;

// out [B, Hkv, Sk, width] = a·b [B, Hq, Sk, width] (a: the transposed scores) summed over each kv head's group of
// q heads.
void product_over_groups(Graph& g, const Key& key, TensorRef a, TensorRef b, TensorRef out, std::int64_t width) {
  const TensorRef keys = per_batch(g, key, true), queries = per_batch(g, key, false);
  if (key.q_heads == key.kv_heads) {
    g.matmul(a, b, out, keys, nullptr, queries);
    return;
  }
  const TensorRef per_head = g.virtual_tensor(data_type(key.dtype), {key.batch, key.q_heads, key.Sk, width},
                                              {key.q_heads * key.Sk * width, key.Sk * width, width, 1});
  g.matmul(a, b, per_head, keys, nullptr, queries);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, per_head, out);
}

}  // namespace

Graph sdpa_forward_graph(const Key& key) {
  Graph g;
  const Sizes z(key);
  const auto [q, k_t, v, o, stats] = forward_tensors(g, key, z);

  TensorRef s = g.virtual_tensor(f32, z.scores, z.scores_strides);
  g.matmul(q, k_t, s, per_batch(g, key, false), per_batch(g, key, true));
  s = g.pointwise(CUDNN_POINTWISE_MUL, s, g.scalar(scale_uid, f32), z.scores, z.scores_strides);
  if (key.padding) s = padding_mask(g, key, s, z);
  s = band_mask(g, key, s, z);
  const auto [exps, sum] = exponentials(g, z, s, stats);
  const TensorRef probabilities = g.virtual_tensor(data_type(key.dtype), z.scores, z.scores_strides);  // the I/O
  g.pointwise(CUDNN_POINTWISE_DIV, exps, sum, nullptr, probabilities);  // type, as the product's A must be
  g.matmul(probabilities, v, o, per_batch(g, key, false), nullptr, per_batch(g, key, true));
  return g;
}

Graph sdpa_backward_graph(const Key& key) {
  Graph g;
  const Sizes z(key);
  const cudnnDataType_t io = data_type(key.dtype);
  const Dims q_dims{key.batch, key.q_heads, key.Sq, key.D}, o_dims{key.batch, key.q_heads, key.Sq, key.Dv};
  const auto [q, k_t, v_t, o, dout, stats, dq, dk, dv] = backward_tensors(g, key, z);
  const TensorRef scale = g.scalar(scale_uid, f32);
  const TensorRef one = g.scalar(one_uid, f32);

  // Each row's Σ dout·o (FlashAttention's δ), kept in the caller's scratch. The frontend's strides for the product.
  const TensorRef products = g.pointwise(CUDNN_POINTWISE_MUL, dout, o, o_dims,
                                         {key.q_heads * key.Sq * key.Dv, key.Sq * key.Dv, key.q_heads * key.Dv, 1});
  const TensorRef row_sums = g.virtual_tensor(f32, z.rows, z.row_strides);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, products, row_sums);
  const TensorRef delta = g.tensor(softmax_sum_uid, f32, z.rows, z.row_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, row_sums, one, nullptr, delta);

  // The probabilities again, from the scores and the forward's log-sum-exp (the mask after the subtraction).
  TensorRef s = g.virtual_tensor(f32, z.scores, z.scores_strides);
  g.matmul(q, k_t, s, per_batch(g, key, false), per_batch(g, key, true));
  s = g.pointwise(CUDNN_POINTWISE_MUL, s, scale, z.scores, z.scores_strides);
  if (key.padding) s = padding_mask(g, key, s, z);
  s = g.pointwise(CUDNN_POINTWISE_SUB, s, stats, z.scores, z.scores_strides);
  s = band_mask(g, key, s, z);
  const TensorRef probabilities = g.pointwise(CUDNN_POINTWISE_EXP, s, nullptr, z.scores, z.scores_strides);

  // dv = Pᵀ·dout
  const TensorRef probabilities_t = g.virtual_tensor(io, z.transposed, z.transposed_strides);
  g.reshape(probabilities, probabilities_t);
  product_over_groups(g, key, probabilities_t, dout, dv, key.Dv);

  // dS = scale · P ∘ (dout·vᵀ − δ)
  const TensorRef dp = g.virtual_tensor(f32, z.scores, z.scores_strides);
  g.matmul(dout, v_t, dp, per_batch(g, key, false), per_batch(g, key, true));
  const TensorRef centered = g.pointwise(CUDNN_POINTWISE_SUB, dp, delta, z.scores, z.scores_strides);
  const TensorRef weighted = g.pointwise(CUDNN_POINTWISE_MUL, centered, probabilities, z.scores, z.scores_strides);
  const TensorRef ds = g.pointwise(CUDNN_POINTWISE_MUL, weighted, scale, z.scores, z.scores_strides);

  // dk = dSᵀ·q
  const TensorRef ds_t = g.virtual_tensor(io, z.transposed, z.transposed_strides);
  g.reshape(ds, ds_t);
  product_over_groups(g, key, ds_t, q, dk, key.D);

  // dq = dS·k: straight into dq when deterministic, else through an f32 sum in scratch (cuDNN's faster way, whose
  // order of additions varies).
  const TensorRef k = g.virtual_tensor(io, {key.batch, key.kv_heads, key.Sk, key.D}, key.k);
  g.reshape(k_t, k);
  if (key.deterministic) {
    g.matmul(ds, k, dq, per_batch(g, key, false), nullptr, per_batch(g, key, true));
  } else {
    const TensorRef dq_sum =
        g.tensor(dq_sum_uid, f32, q_dims, {key.q_heads * key.Sq * key.D, key.Sq * key.D, key.D, 1});
    g.matmul(ds, k, dq_sum, per_batch(g, key, false), nullptr, per_batch(g, key, true));
    g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_sum, nullptr, nullptr, dq);
  }
  return g;
}

}  // namespace tapegrad::cuda::cudnn

// The SDPA graphs (cudnn_sdpa.hpp), operation by operation as cudnn-frontend emits them.
#include "tapegrad/cuda/cudnn_sdpa.hpp"

namespace tapegrad::cuda::cudnn {

namespace {

constexpr cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
using Key = SdpaKey;

cudnnDataType_t io_type(DType dtype) { return dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

Dims transposed(const Dims& s) { return {s[0], s[1], s[3], s[2]}; }

// The dims and strides of the scores [B, Hq, Sq, Sk], their transpose, and the rows' statistics [B, Hq, Sq, 1].
struct Sizes {
  Dims scores, scores_strides, transposed, transposed_strides, rows, row_strides;
  explicit Sizes(const Key& k)
      : scores{k.batch, k.q_heads, k.Sq, k.Sk},
        scores_strides{k.q_heads * k.Sq * k.Sk, k.Sq * k.Sk, k.Sk, 1},
        transposed{k.batch, k.q_heads, k.Sk, k.Sq},
        transposed_strides{k.q_heads * k.Sq * k.Sk, k.Sq * k.Sk, 1, k.Sk},
        rows{k.batch, k.q_heads, k.Sq, 1},
        row_strides{k.q_heads * k.Sq, k.Sq, 1, 1} {}
};

// Each batch element's valid queries (or keys) as the graph reads them: a [batch] tensor when padded, else Sq (Sk) by
// value.
TensorRef lengths(Graph& g, const Key& key, bool keys) {
  if (!key.padding) return g.scalar(keys ? kv_length_uid : q_length_uid, CUDNN_DATA_INT32);
  return g.tensor(keys ? kv_lengths_uid : q_lengths_uid, CUDNN_DATA_INT32, {key.batch, 1, 1, 1}, {1, 1, 1, 1});
}

// What a product's M, N or K override reads: the lengths when padded, nothing otherwise.
TensorRef per_batch(Graph& g, const Key& key, bool keys) { return key.padding ? lengths(g, key, keys) : nullptr; }

// The scores' row (axis 2) or column (axis 3) indices.
TensorRef indices(Graph& g, TensorRef s, const Sizes& z, std::int64_t axis, cudnnDataType_t precision) {
  const TensorRef i = g.virtual_tensor(CUDNN_DATA_INT32, z.scores, z.scores_strides);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, i, precision, axis);
  return i;
}

// s where `keep`, -inf elsewhere.
TensorRef select(Graph& g, TensorRef s, TensorRef keep, const Sizes& z) {
  const TensorRef masked = g.virtual_tensor(f32, z.scores, z.scores_strides);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, g.scalar(minus_inf_uid, f32), keep, masked);
  return masked;
}

// The keys a query sees, as cudnn-frontend spells its masks. Padding (per-batch lengths): s where the row is below
// its batch's queries and the column below its keys. The band (its CompositeDiagonalBandMaskNode, one per side): s
// where the row index (moved by Sk - Sq to the bottom-right diagonal, plus the right bound) is at least the column's,
// then where the column plus the left bound + 1 (moved likewise) exceeds the row's.
TensorRef padding_mask(Graph& g, const Key& key, TensorRef s, const Sizes& z) {
  const auto below = [&](TensorRef index, TensorRef limit) {
    const TensorRef y = g.virtual_tensor(CUDNN_DATA_BOOLEAN, z.scores, z.scores_strides);
    g.pointwise(CUDNN_POINTWISE_CMP_LT, index, limit, nullptr, y, CUDNN_DATA_BOOLEAN);
    return y;
  };
  // (both indices before the comparisons, the frontend's order of operations)
  const TensorRef row = indices(g, s, z, 2, CUDNN_DATA_INT32), column = indices(g, s, z, 3, CUDNN_DATA_INT32);
  const TensorRef rows = below(row, lengths(g, key, false)), columns = below(column, lengths(g, key, true));
  const TensorRef keep = g.virtual_tensor(CUDNN_DATA_BOOLEAN, z.scores, z.scores_strides);
  g.pointwise(CUDNN_POINTWISE_LOGICAL_AND, rows, columns, nullptr, keep, CUDNN_DATA_BOOLEAN);
  return select(g, s, keep, z);
}

TensorRef band_side(Graph& g, const Key& key, TensorRef s, const Sizes& z, bool right) {
  const auto shifted = [&](cudnnPointwiseMode_t mode, TensorRef x, TensorRef by, cudnnDataType_t type) {
    const TensorRef y = g.virtual_tensor(type, z.scores, z.scores_strides);
    g.pointwise(mode, x, by, nullptr, y, type, 3);
    return y;
  };
  constexpr cudnnDataType_t i32 = CUDNN_DATA_INT32;
  TensorRef row = indices(g, s, z, 2, f32), column = indices(g, s, z, 3, f32);
  const TensorRef keep = g.virtual_tensor(CUDNN_DATA_BOOLEAN, z.scores, z.scores_strides);
  if (right) {
    if (key.bottom_right) {
      row = shifted(CUDNN_POINTWISE_ADD, row, lengths(g, key, true), i32);
      row = shifted(CUDNN_POINTWISE_SUB, row, lengths(g, key, false), i32);
    }
    if (key.right_bound > 0) row = shifted(CUDNN_POINTWISE_ADD, row, g.scalar(right_bound_uid, i32), i32);
    g.pointwise(CUDNN_POINTWISE_CMP_GE, row, column, nullptr, keep, CUDNN_DATA_BOOLEAN);
  } else if (key.bottom_right && key.padding) {  // the shift per batch element
    column = shifted(CUDNN_POINTWISE_ADD, column, g.scalar(left_window_uid, i32), i32);
    column = shifted(CUDNN_POINTWISE_SUB, column, lengths(g, key, true), i32);
    column = shifted(CUDNN_POINTWISE_ADD, column, lengths(g, key, false), i32);
    g.pointwise(CUDNN_POINTWISE_CMP_GT, column, row, nullptr, keep, CUDNN_DATA_BOOLEAN);
  } else {  // a fixed shift, folded into the bound
    column = shifted(CUDNN_POINTWISE_ADD, column, g.scalar(left_bound_uid, f32), f32);
    g.pointwise(CUDNN_POINTWISE_CMP_GT, column, row, nullptr, keep, CUDNN_DATA_BOOLEAN);
  }
  return select(g, s, keep, z);
}

TensorRef band_mask(Graph& g, const Key& key, TensorRef s, const Sizes& z) {
  if (key.right_bound >= 0) s = band_side(g, key, s, z, true);
  if (key.left_bound >= 0) s = band_side(g, key, s, z, false);
  return s;
}

// out [B, Hkv, Sk, width] = a·b [B, Hq, Sk, width] (a: the transposed scores) summed over each kv head's group of
// q heads.
void product_over_groups(Graph& g, const Key& key, TensorRef a, TensorRef b, TensorRef out, std::int64_t width) {
  const TensorRef keys = per_batch(g, key, true), queries = per_batch(g, key, false);
  if (key.q_heads == key.kv_heads) {
    g.matmul(a, b, out, keys, nullptr, queries);
    return;
  }
  const TensorRef per_head = g.virtual_tensor(io_type(key.dtype), {key.batch, key.q_heads, key.Sk, width},
                                              {key.q_heads * key.Sk * width, key.Sk * width, width, 1});
  g.matmul(a, b, per_head, keys, nullptr, queries);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, per_head, out);
}

}  // namespace

Graph sdpa_forward_graph(const Key& key) {
  Graph g;
  const Sizes z(key);
  const cudnnDataType_t io = io_type(key.dtype);
  const TensorRef q = g.tensor(q_uid, io, {key.batch, key.q_heads, key.Sq, key.D}, key.q);
  const TensorRef k_t = g.tensor(k_uid, io, {key.batch, key.kv_heads, key.D, key.Sk}, transposed(key.k));
  const TensorRef v = g.tensor(v_uid, io, {key.batch, key.kv_heads, key.Sk, key.Dv}, key.v);
  const TensorRef o = g.tensor(o_uid, io, {key.batch, key.q_heads, key.Sq, key.Dv}, key.o);
  const TensorRef stats = g.tensor(stats_uid, f32, z.rows, z.row_strides);
  const TensorRef scale = g.scalar(scale_uid, f32);

  TensorRef s = g.virtual_tensor(f32, z.scores, z.scores_strides);
  g.matmul(q, k_t, s, per_batch(g, key, false), per_batch(g, key, true));
  s = g.pointwise(CUDNN_POINTWISE_MUL, s, scale, z.scores, z.scores_strides);
  if (key.padding) s = padding_mask(g, key, s, z);
  s = band_mask(g, key, s, z);
  const TensorRef max = g.virtual_tensor(f32, z.rows, z.row_strides);
  g.reduce(CUDNN_REDUCE_TENSOR_MAX, s, max);
  const TensorRef shifted = g.pointwise(CUDNN_POINTWISE_SUB, s, max, z.scores, z.scores_strides);
  const TensorRef exps = g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, z.scores, z.scores_strides);
  const TensorRef sum = g.virtual_tensor(f32, z.rows, z.row_strides);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, exps, sum);
  const TensorRef log_sum = g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, z.rows, z.row_strides);
  g.pointwise(CUDNN_POINTWISE_ADD, max, log_sum, nullptr, stats);
  const TensorRef probabilities = g.virtual_tensor(io, z.scores, z.scores_strides);  // the I/O type, as the
  g.pointwise(CUDNN_POINTWISE_DIV, exps, sum, nullptr, probabilities);                 // product's A must be
  g.matmul(probabilities, v, o, per_batch(g, key, false), nullptr, per_batch(g, key, true));
  return g;
}

Graph sdpa_backward_graph(const Key& key) {
  Graph g;
  const Sizes z(key);
  const cudnnDataType_t io = io_type(key.dtype);
  const Dims q_dims{key.batch, key.q_heads, key.Sq, key.D}, o_dims{key.batch, key.q_heads, key.Sq, key.Dv};
  const TensorRef q = g.tensor(q_uid, io, q_dims, key.q);
  const TensorRef k_t = g.tensor(k_uid, io, {key.batch, key.kv_heads, key.D, key.Sk}, transposed(key.k));
  const TensorRef v_t = g.tensor(v_uid, io, {key.batch, key.kv_heads, key.Dv, key.Sk}, transposed(key.v));
  const TensorRef o = g.tensor(o_uid, io, o_dims, key.o);
  const TensorRef dout = g.tensor(dout_uid, io, o_dims, key.o);
  const TensorRef stats = g.tensor(stats_uid, f32, z.rows, z.row_strides);
  const TensorRef dq = g.tensor(dq_uid, io, q_dims, key.q);
  const TensorRef dk = g.tensor(dk_uid, io, {key.batch, key.kv_heads, key.Sk, key.D}, key.k);
  const TensorRef dv = g.tensor(dv_uid, io, {key.batch, key.kv_heads, key.Sk, key.Dv}, key.v);
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

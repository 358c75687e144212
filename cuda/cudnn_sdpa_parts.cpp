// The parts the SDPA graphs share (cuda/detail/cudnn_sdpa_parts.hpp), as cudnn-frontend writes them.
#include "tapegrad/cuda/detail/cudnn_sdpa_parts.hpp"

#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::cuda::cudnn::sdpa {

using Key = SdpaKey;

cudnnDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::f8e4m3: return CUDNN_DATA_FP8_E4M3;
    case DType::f8e5m2: return CUDNN_DATA_FP8_E5M2;
    default: throw Refused{detail::concat("cuDNN's attention graphs take no ", dtype_name(dtype), " tensors")};
  }
}

Dims transposed(const Dims& s) { return {s[0], s[1], s[3], s[2]}; }

Sizes::Sizes(const Key& k)
    : scores{k.batch, k.q_heads, k.Sq, k.Sk},
      scores_strides{k.q_heads * k.Sq * k.Sk, k.Sq * k.Sk, k.Sk, 1},
      transposed{k.batch, k.q_heads, k.Sk, k.Sq},
      transposed_strides{k.q_heads * k.Sq * k.Sk, k.Sq * k.Sk, 1, k.Sk},
      rows{k.batch, k.q_heads, k.Sq, 1},
      row_strides{k.q_heads * k.Sq, k.Sq, 1, 1} {}

namespace {

// Each batch element's valid queries (or keys) as the graph reads them: a [batch] tensor when padded, else Sq (Sk) by
// value.
TensorRef lengths(Graph& g, const Key& key, bool keys) {
  if (!key.padding) return g.scalar(keys ? kv_length_uid : q_length_uid, CUDNN_DATA_INT32);
  return g.tensor(keys ? kv_lengths_uid : q_lengths_uid, CUDNN_DATA_INT32, {key.batch, 1, 1, 1}, {1, 1, 1, 1});
}

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

// One side of the band (cudnn-frontend's CompositeDiagonalBandMaskNode writes one per side).
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

}  // namespace

ForwardTensors forward_tensors(Graph& g, const Key& key, const Sizes& z) {
  const cudnnDataType_t type = data_type(key.dtype);
  return {.q = g.tensor(q_uid, type, {key.batch, key.q_heads, key.Sq, key.D}, key.q),
          .k_t = g.tensor(k_uid, type, {key.batch, key.kv_heads, key.D, key.Sk}, transposed(key.k)),
          .v = g.tensor(v_uid, type, {key.batch, key.kv_heads, key.Sk, key.Dv}, key.v),
          .o = g.tensor(o_uid, type, {key.batch, key.q_heads, key.Sq, key.Dv}, key.o),
          .stats = g.tensor(stats_uid, f32, z.rows, z.row_strides)};
}

BackwardTensors backward_tensors(Graph& g, const Key& key, const Sizes& z) {
  const cudnnDataType_t type = data_type(key.dtype);
  const cudnnDataType_t gradient = is_fp8(key.dtype) ? data_type(key.gradient_dtype) : type;
  const Dims q_dims{key.batch, key.q_heads, key.Sq, key.D}, o_dims{key.batch, key.q_heads, key.Sq, key.Dv};
  return {.q = g.tensor(q_uid, type, q_dims, key.q),
          .k_t = g.tensor(k_uid, type, {key.batch, key.kv_heads, key.D, key.Sk}, transposed(key.k)),
          .v_t = g.tensor(v_uid, type, {key.batch, key.kv_heads, key.Dv, key.Sk}, transposed(key.v)),
          .o = g.tensor(o_uid, type, o_dims, key.o),
          .dout = g.tensor(dout_uid, gradient, o_dims, key.o),
          .stats = g.tensor(stats_uid, f32, z.rows, z.row_strides),
          .dq = g.tensor(dq_uid, gradient, q_dims, key.q),
          .dk = g.tensor(dk_uid, gradient, {key.batch, key.kv_heads, key.Sk, key.D}, key.k),
          .dv = g.tensor(dv_uid, gradient, {key.batch, key.kv_heads, key.Sk, key.Dv}, key.v)};
}

Exponentials exponentials(Graph& g, const Sizes& z, TensorRef s, TensorRef stats) {
  const TensorRef max = g.virtual_tensor(f32, z.rows, z.row_strides);
  g.reduce(CUDNN_REDUCE_TENSOR_MAX, s, max);
  const TensorRef shifted = g.pointwise(CUDNN_POINTWISE_SUB, s, max, z.scores, z.scores_strides);
  const TensorRef exps = g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, z.scores, z.scores_strides);
  const TensorRef sum = g.virtual_tensor(f32, z.rows, z.row_strides);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, exps, sum);
  const TensorRef log_sum = g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, z.rows, z.row_strides);
  g.pointwise(CUDNN_POINTWISE_ADD, max, log_sum, nullptr, stats);
  return {exps, sum};
}

TensorRef per_batch(Graph& g, const Key& key, bool keys) { return key.padding ? lengths(g, key, keys) : nullptr; }

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

TensorRef band_mask(Graph& g, const Key& key, TensorRef s, const Sizes& z) {
  if (key.right_bound >= 0) s = band_side(g, key, s, z, true);
  if (key.left_bound >= 0) s = band_side(g, key, s, z, false);
  return s;
}

}  // namespace tapegrad::cuda::cudnn::sdpa

// The FP8 SDPA graphs (cudnn_sdpa.hpp), operation by operation as cudnn-frontend 1.23 emits them for FP8 operands
// (its CompositeSDPANode with an FP8 core, and SDPAFP8BackwardNode): cuDNN's engines recognize the graph by its shape,
// so where this differs from the bf16 graphs it is the frontend's doing: the probabilities stay f32 until their scaled
// copy, the backward masks the scores before subtracting the log-sum-exp and keeps δ inside the kernel, and k's
// reshape in the backward is declared f32.
#include "tapegrad/cuda/cudnn_sdpa.hpp"

#include "tapegrad/cuda/detail/cudnn_sdpa_parts.hpp"

namespace tapegrad::cuda::cudnn {

namespace {

using namespace sdpa;
using Key = SdpaKey;

TensorRef device_scalar(Graph& g, SdpaUid uid) { return g.tensor(uid, f32, {1, 1, 1, 1}, {1, 1, 1, 1}); }

// x × the scalar `by`, in f32 with x's dims and strides.
TensorRef times(Graph& g, TensorRef x, TensorRef by, const Dims& dims, const Dims& strides) {
  return g.pointwise(CUDNN_POINTWISE_MUL, x, by, dims, strides);
}

// One FP8 product as the frontend's MatmulFP8Node writes it: c = a·b in f32 (rows × width per q head, summed over
// each kv head's group of q heads where out has fewer heads), × descale_a × descale_b, then × scale into `out` and
// the amax of the unscaled result into `amax`. m and k: the product's per-batch overrides (rows and inner size).
struct Fp8Product {
  TensorRef a, b, out;
  SdpaUid descale_a, descale_b, scale, amax;
  std::int64_t rows, width, out_heads;
  TensorRef m, k;
};

void fp8_product(Graph& g, const Key& key, const Fp8Product& p) {
  Dims dims{key.batch, key.q_heads, p.rows, p.width};
  Dims strides{key.q_heads * p.rows * p.width, p.rows * p.width, p.width, 1};
  TensorRef c = g.virtual_tensor(f32, dims, strides);
  g.matmul(p.a, p.b, c, p.m, nullptr, p.k);
  if (p.out_heads != key.q_heads) {  // (the frontend's strides for the group sums: heads innermost)
    dims = {key.batch, p.out_heads, p.rows, p.width};
    strides = {p.out_heads * p.rows * p.width, 1, p.width * p.out_heads, p.out_heads};
    const TensorRef sums = g.virtual_tensor(f32, dims, strides);
    g.reduce(CUDNN_REDUCE_TENSOR_ADD, c, sums);
    c = sums;
  }
  c = times(g, c, device_scalar(g, p.descale_a), dims, strides);
  const TensorRef real = times(g, c, device_scalar(g, p.descale_b), dims, strides);
  g.pointwise(CUDNN_POINTWISE_MUL, real, device_scalar(g, p.scale), nullptr, p.out);
  g.reduce(CUDNN_REDUCE_TENSOR_AMAX, real, device_scalar(g, p.amax));
}

// The scaled scores q·kᵀ × the attention scale × descale_q × descale_k, f32.
TensorRef scores(Graph& g, const Key& key, const Sizes& z, TensorRef q, TensorRef k_t) {
  TensorRef s = g.virtual_tensor(f32, z.scores, z.scores_strides);
  g.matmul(q, k_t, s, per_batch(g, key, false), per_batch(g, key, true));
  s = times(g, s, g.scalar(scale_uid, f32), z.scores, z.scores_strides);
  s = times(g, s, device_scalar(g, descale_q_uid), z.scores, z.scores_strides);
  return times(g, s, device_scalar(g, descale_k_uid), z.scores, z.scores_strides);
}

TensorRef masked(Graph& g, const Key& key, const Sizes& z, TensorRef s) {
  if (key.padding) s = padding_mask(g, key, s, z);
  return band_mask(g, key, s, z);
}

// x × scale cast to `type` (FP8) through the output's type, [B, Hq, Sq, Sk].
TensorRef quantized(Graph& g, const Sizes& z, TensorRef x, SdpaUid scale, cudnnDataType_t type) {
  const TensorRef y = g.virtual_tensor(type, z.scores, z.scores_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, x, device_scalar(g, scale), nullptr, y);
  return y;
}

TensorRef transposed_scores(Graph& g, const Sizes& z, TensorRef x, cudnnDataType_t type) {
  const TensorRef y = g.virtual_tensor(type, z.transposed, z.transposed_strides);
  g.reshape(x, y);
  return y;
}

}  // namespace

Graph sdpa_fp8_forward_graph(const Key& key) {
  Graph g;
  const Sizes z(key);
  const auto [q, k_t, v, o, stats] = forward_tensors(g, key, z);
  const auto [exps, sum] = exponentials(g, z, masked(g, key, z, scores(g, key, z, q, k_t)), stats);
  const TensorRef probabilities = g.pointwise(CUDNN_POINTWISE_DIV, exps, sum, z.scores, z.scores_strides);
  g.reduce(CUDNN_REDUCE_TENSOR_AMAX, probabilities, device_scalar(g, amax_s_uid));
  fp8_product(g, key,
              {.a = quantized(g, z, probabilities, scale_s_uid, data_type(key.dtype)), .b = v, .out = o,
               .descale_a = descale_s_uid, .descale_b = descale_v_uid, .scale = scale_o_uid, .amax = amax_o_uid,
               .rows = key.Sq, .width = key.Dv, .out_heads = key.q_heads, .m = per_batch(g, key, false),
               .k = per_batch(g, key, true)});
  return g;
}

Graph sdpa_fp8_backward_graph(const Key& key) {
  Graph g;
  const Sizes z(key);
  const cudnnDataType_t e4m3 = data_type(key.dtype), grad = data_type(key.gradient_dtype);
  const Dims o_dims{key.batch, key.q_heads, key.Sq, key.Dv};
  const auto [q, k_t, v_t, o, dout, stats, dq, dk, dv] = backward_tensors(g, key, z);
  const TensorRef attention_scale = g.scalar(scale_uid, f32);
  const TensorRef queries = per_batch(g, key, false), keys = per_batch(g, key, true);

  // δ: each row's Σ dout·o, descaled (the product in dout's strides, as the frontend leaves them)
  const TensorRef products = g.pointwise(CUDNN_POINTWISE_MUL, dout, o, o_dims, key.o);
  TensorRef delta = g.virtual_tensor(f32, z.rows, z.row_strides);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, products, delta);
  delta = times(g, delta, device_scalar(g, descale_dout_uid), z.rows, z.row_strides);
  delta = times(g, delta, device_scalar(g, descale_o_uid), z.rows, z.row_strides);

  // The probabilities again: the masks before the log-sum-exp's subtraction
  TensorRef s = masked(g, key, z, scores(g, key, z, q, k_t));
  s = g.pointwise(CUDNN_POINTWISE_SUB, s, stats, z.scores, z.scores_strides);
  const TensorRef probabilities = g.pointwise(CUDNN_POINTWISE_EXP, s, nullptr, z.scores, z.scores_strides);

  // dv = Pᵀ·dout, P in e4m3 under the forward's scale
  const TensorRef p8 = quantized(g, z, probabilities, scale_s_uid, e4m3);
  fp8_product(g, key,
              {.a = transposed_scores(g, z, p8, e4m3), .b = dout, .out = dv, .descale_a = descale_s_uid,
               .descale_b = descale_dout_uid, .scale = scale_dv_uid, .amax = amax_dv_uid, .rows = key.Sk,
               .width = key.Dv, .out_heads = key.kv_heads, .m = keys, .k = queries});

  // dS = scale · P ∘ (dout·vᵀ − δ), its amax, and its copy in the gradients' type
  TensorRef dp = g.virtual_tensor(f32, z.scores, z.scores_strides);
  g.matmul(dout, v_t, dp, queries, keys);
  dp = times(g, dp, device_scalar(g, descale_dout_uid), z.scores, z.scores_strides);
  dp = times(g, dp, device_scalar(g, descale_v_uid), z.scores, z.scores_strides);
  const TensorRef centered = g.pointwise(CUDNN_POINTWISE_SUB, dp, delta, z.scores, z.scores_strides);
  const TensorRef weighted = g.pointwise(CUDNN_POINTWISE_MUL, centered, probabilities, z.scores, z.scores_strides);
  const TensorRef ds = times(g, weighted, attention_scale, z.scores, z.scores_strides);
  g.reduce(CUDNN_REDUCE_TENSOR_AMAX, ds, device_scalar(g, amax_dp_uid));
  const TensorRef ds8 = quantized(g, z, ds, scale_dp_uid, grad);

  // dq = dS·k
  const TensorRef k = g.virtual_tensor(f32, {key.batch, key.kv_heads, key.Sk, key.D}, key.k);
  g.reshape(k_t, k);
  fp8_product(g, key,
              {.a = ds8, .b = k, .out = dq, .descale_a = descale_dp_uid, .descale_b = descale_k_uid,
               .scale = scale_dq_uid, .amax = amax_dq_uid, .rows = key.Sq, .width = key.D,
               .out_heads = key.q_heads, .m = queries, .k = keys});

  // dk = dSᵀ·q
  fp8_product(g, key,
              {.a = transposed_scores(g, z, ds8, grad), .b = q, .out = dk, .descale_a = descale_dp_uid,
               .descale_b = descale_q_uid, .scale = scale_dk_uid, .amax = amax_dk_uid, .rows = key.Sk,
               .width = key.D, .out_heads = key.kv_heads, .m = keys, .k = queries});
  return g;
}

}  // namespace tapegrad::cuda::cudnn

// What the SDPA graphs of cuda/cudnn_sdpa.hpp share, bf16's and FP8's: the scores' sizes, the masks as
// cudnn-frontend spells them and the I/O types. Internal to cuda/ (the sources that see cuDNN's headers).
#pragma once

#include "tapegrad/cuda/cudnn_sdpa.hpp"

namespace tapegrad::cuda::cudnn::sdpa {

inline constexpr cudnnDataType_t f32 = CUDNN_DATA_FLOAT;

// cuDNN's type of a graph's I/O tensors: bf16, f16, or FP8's e4m3 and e5m2.
cudnnDataType_t data_type(DType dtype);

// [B, H, S, D] strides with the last two axes swapped: the tensor read as [B, H, D, S].
Dims transposed(const Dims& s);

// The dims and strides of the scores [B, Hq, Sq, Sk], their transpose, and the rows' statistics [B, Hq, Sq, 1].
struct Sizes {
  Dims scores, scores_strides, transposed, transposed_strides, rows, row_strides;
  explicit Sizes(const SdpaKey& k);
};

// The forward's bound tensors: q, k (read transposed: [B, Hkv, D, Sk]), v and o in key.dtype, and the rows'
// log-sum-exp (f32).
struct ForwardTensors {
  TensorRef q, k_t, v, o, stats;
};
ForwardTensors forward_tensors(Graph& g, const SdpaKey& key, const Sizes& z);

// The backward's bound tensors: q, k and v (k and v read transposed), o, dout, the rows' log-sum-exp (f32), dq, dk
// and dv; dout and the gradients in key.gradient_dtype for the FP8 graphs, in key.dtype otherwise.
struct BackwardTensors {
  TensorRef q, k_t, v_t, o, dout, stats, dq, dk, dv;
};
BackwardTensors backward_tensors(Graph& g, const SdpaKey& key, const Sizes& z);

// The forward's softmax of the masked scores s: each row's max, exp(s - max) and its sum, and the log-sum-exp
// (max + log sum) written into stats.
struct Exponentials {
  TensorRef exps, sum;
};
Exponentials exponentials(Graph& g, const Sizes& z, TensorRef s, TensorRef stats);

// What a product's M, N or K override reads: each batch element's valid queries (or keys, with `keys`) as a [batch]
// tensor when padded, nothing otherwise.
TensorRef per_batch(Graph& g, const SdpaKey& key, bool keys);

// The scores s with the key's masks applied (-inf where a query does not see a key): padding (per-batch lengths)
// and the band (causal or windowed), each as the frontend writes it.
TensorRef padding_mask(Graph& g, const SdpaKey& key, TensorRef s, const Sizes& z);
TensorRef band_mask(Graph& g, const SdpaKey& key, TensorRef s, const Sizes& z);

}  // namespace tapegrad::cuda::cudnn::sdpa

#include "tapegrad/ops/nn/attention.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/layout.hpp"
#include "tapegrad/ops/matmul.hpp"
#include "tapegrad/ops/softmax.hpp"
#include "tapegrad/tensor/factories.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"
#include "tapegrad/tensor/gpu/detail/fill.hpp"

namespace tapegrad::nn {

namespace {

// [Sq, Sk] on `device`: 0 where key j may be attended from query i (j <= i), -inf above the diagonal. Filled in
// place on a GPU (no host copy, which would wait for the stream).
template <class U> Tensor<U> causal_mask(std::int64_t Sq, std::int64_t Sk, Device device) {
  constexpr double minus_infinity = -std::numeric_limits<double>::infinity();
  return by_device(
      "causal_mask", device,
      [&] {
        Tensor<U> mask = zeros<U>({Sq, Sk});
        const U above = convert<U>(minus_infinity);
        for (std::int64_t i = 0; i < Sq; ++i) {
          for (std::int64_t j = i + 1; j < Sk; ++j) mask(i, j) = above;
        }
        return mask;
      },
      [&](auto gpu) {
        Tensor<U> mask({Sq, Sk}, gpu);
        cuda::fill_triangular(dtype_v<U>, mask.data(), Sq, Sk, 0.0, minus_infinity, gpu.index);
        return mask;
      });
}

}  // namespace

template <class U> Var<U> dot_product_attention(const Var<U>& q, const Var<U>& k, const Var<U>& v, bool causal) {
  const Shape &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  check(qs.rank() >= 2 && ks.rank() >= 2 && vs.rank() >= 2 && qs.dim(-1) == ks.dim(-1) && ks.dim(-2) == vs.dim(-2),
        "dot_product_attention", "q ", qs, ", k ", ks, " and v ", vs,
        " should be [..., Sq, D], [..., Sk, D] and [..., Sk, Dv]");
  const std::int64_t Sq = qs.dim(-2), Sk = ks.dim(-2);
  check(!causal || Sq == Sk, "dot_product_attention", "a causal mask needs as many queries as keys, got q ", qs,
        " and k ", ks);
  const double scale = 1.0 / std::sqrt(static_cast<double>(qs.dim(-1)));
  const Var<U> scores = matmul(q, transpose(k));  // [..., Sq, Sk]
  const Var<U> logits =
      causal ? Var<U>(scores * scale + constant(causal_mask<U>(Sq, Sk, q.device()))) : Var<U>(scores * scale);
  return matmul(softmax(logits, -1), v);
}

namespace detail {

MultiHeadAttentionConfig resolve_attention(std::int64_t hidden, MultiHeadAttentionConfig config) {
  check(hidden > 0 && config.num_heads > 0, "MultiHeadAttention", "hidden size and num_heads must be positive, got ",
        hidden, " and ", config.num_heads);
  if (config.head_dim == 0) {
    check(hidden % config.num_heads == 0, "MultiHeadAttention", "hidden size ", hidden,
          " is not divisible by num_heads ", config.num_heads, "; set head_dim to choose the head size");
    config.head_dim = hidden / config.num_heads;
  }
  check(config.head_dim > 0, "MultiHeadAttention", "head_dim must be positive (or 0 for hidden / num_heads), got ",
        config.head_dim);
  return config;
}

LayerNormDenseConfig qkv_config(const MultiHeadAttentionConfig& config) {
  return {.dense = {.features = 3 * config.num_heads * config.head_dim,
                    .use_bias = config.use_bias,
                    .kernel_init = config.kernel_init,
                    .bias_init = config.bias_init},
          .norm = config.norm};
}

DenseConfig out_config(std::int64_t hidden, const MultiHeadAttentionConfig& config) {
  return {.features = hidden, .use_bias = config.use_bias, .kernel_init = config.kernel_init,
          .bias_init = config.bias_init};
}

template <class U>
Var<U> attend_heads(const Var<U>& qkv, std::int64_t heads, std::int64_t head_dim, bool causal) {
  const Shape& shape = qkv.shape();
  const std::int64_t width = heads * head_dim;
  check(shape.rank() >= 2 && shape.dim(-1) == 3 * width, "MultiHeadAttention", "the qkv projection has shape ",
        shape, " but ", heads, " heads of size ", head_dim, " need [..., S, ", 3 * width, "]");
  std::vector<std::int64_t> dims = shape.to_vector();
  const std::int64_t S = dims[dims.size() - 2];
  std::int64_t batch = 1;
  for (std::size_t axis = 0; axis + 2 < dims.size(); ++axis) batch *= dims[axis];
  // Part 0, 1, 2 (q, k, v) of every head: [batch, heads, S, head_dim].
  auto part = [&](std::int64_t index) {
    const Var<U> columns = slice(qkv, -1, index * width, (index + 1) * width);
    return permute(reshape(columns, {batch, S, heads, head_dim}), {0, 2, 1, 3});
  };
  const Var<U> attended = dot_product_attention(part(0), part(1), part(2), causal);
  dims.back() = width;
  return reshape(permute(attended, {0, 2, 1, 3}), dims);
}

}  // namespace detail

#define TAPEGRAD_INSTANTIATE_ATTENTION(U)                                                                  \
  template Var<U> dot_product_attention<U>(const Var<U>&, const Var<U>&, const Var<U>&, bool);             \
  template Var<U> detail::attend_heads<U>(const Var<U>&, std::int64_t, std::int64_t, bool);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_ATTENTION)

}  // namespace tapegrad::nn

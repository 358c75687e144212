// dot_product_attention's GPU kernels (the FlashAttention algorithm, as the CPU's ops/detail/flash_attention.hpp):
// host launchers in plain C++ (see tensor/gpu/backend.hpp for how ops call them). The problem, its masks and dropout
// rule are cuda/attention_problem.hpp's; its length pointers, when set, are device memory. Every pointer is memory of
// `device`; work is queued on its current stream. Deterministic: every output element is summed by one thread in a
// fixed order (no atomics).
#pragma once

#include "tapegrad/cuda/attention_problem.hpp"
#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

// The largest head size the kernels take (q's and v's).
inline constexpr std::int64_t attention_max_head_dim = 256;

// o (p.o's strides) and log_sums (the compute type, [batch, q_heads, Sq]) from q, k, v and the bias (null without).
void attention_forward(DType dtype, const attention::Problem& p, const void* q, const void* k, const void* v,
                       const void* bias, void* o, void* log_sums, int device);

// dq, dk, dv (their inputs' strides) from the forward's o and log_sums and dout (p.o's strides). delta: scratch of
// the compute type, [batch, q_heads, Sq]. dbias, when not null: the bias's gradient accumulated into zeros of the
// compute type, [Bb, Hb, Sq, Sk] as p's bias strides say.
void attention_backward(DType dtype, const attention::Problem& p, const void* q, const void* k, const void* v,
                        const void* bias, const void* o, const void* log_sums, const void* dout, void* delta, void* dq,
                        void* dk, void* dv, void* dbias, int device);

// What cuda/cudnn_attention.cpp needs around cuDNN's padded attention: each batch element's valid queries and keys
// as int32 (Sq and Sk where p has no lengths); and zeros in the rows of t [batch, heads, S,
// width] (strides r) past each batch element's queries (S = Sq; -inf in log_sums' rows too when not null) or keys
// (S = Sk), which cuDNN leaves unwritten.
void attention_lengths_int32(const attention::Problem& p, std::int32_t* queries, std::int32_t* keys, int device);
void attention_clear_padding(DType dtype, const attention::Problem& p, void* t, const attention::RowStrides& r,
                             std::int64_t heads, std::int64_t width, bool queries, void* log_sums, int device);

}  // namespace tapegrad::cuda

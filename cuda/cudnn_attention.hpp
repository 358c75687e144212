// dot_product_attention on cuDNN's fused flash-attention engines: the scaled-dot-product-attention graphs of cuDNN 9
// (as cudnn-frontend builds them), for the problems they take: bf16 and f16 without dropout (cuDNN draws its own
// numbers, not the project's) or a bias; causal masks, sliding windows of both alignments and per-batch lengths
// (padding: the rows past them zeroed here, as tapegrad's kernels give them) where every query sees a key;
// grouped-query heads; head sizes that are multiples of 8 up to 256; any layout whose rows start on 16 bytes (q's
// heads packed by kv group are gathered into a scratch copy first). Plans are compiled once per problem and kept; a
// problem cuDNN refuses is remembered as refused. Plain C++, as cuda/attention.hpp, whose launchers call these first.
#pragma once

#include <cstdint>
#include <string>

#include "tapegrad/cuda/attention_problem.hpp"
#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

// Why cuDNN does not run `p`'s forward (or backward) in `dtype` on `device`, e.g. "dropout" or cuDNN's own reason;
// empty when it does. The first call for a problem compiles its plan.
std::string cudnn_attention_refusal(DType dtype, const attention::Problem& p, bool backward, int device);

// attention_forward and attention_backward (cuda/attention.hpp, same arguments) on cuDNN: queued and true when cuDNN
// takes the problem, false with nothing queued otherwise. The backward's delta is its scratch too.
bool cudnn_attention_forward(DType dtype, const attention::Problem& p, const void* q, const void* k, const void* v,
                             void* o, void* log_sums, int device);
bool cudnn_attention_backward(DType dtype, const attention::Problem& p, const void* q, const void* k, const void* v,
                              const void* o, const void* log_sums, const void* dout, void* delta, void* dq, void* dk,
                              void* dv, int device);

// How many compiled plans the first calls of problems have run to choose among (set_attention_autotune), in this
// process: for tests.
std::int64_t cudnn_attention_candidates_timed();

}  // namespace tapegrad::cuda

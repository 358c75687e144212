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

// FP8 attention on cuDNN's FP8 engines (Hopper; TransformerEngine's fused FP8 attention, cuda/cudnn_sdpa.hpp's FP8
// graphs): q, k, v and o are e4m3 codes, the backward's dout, dq, dk and dv codes of `gradient_dtype` (f8e5m2 in the
// hybrid format, or f8e4m3), each read as code × its descale and written as value × its scale; the probabilities
// are quantized to e4m3 with scale_s in both passes (the backward must be given the forward's), the scores'
// gradient to gradient_dtype with scale_dp. Every scale, descale and amax is one f32 of device memory that starts on
// 16 bytes (as the graphs declare; Error otherwise). Amaxes are of the unscaled values: the forward's of the
// probabilities (s) and of o, the backward's of the scores' gradient (dp), dq, dk and dv; each is set, not merged.
struct Fp8AttentionScales {
  const float *descale_q = nullptr, *descale_k = nullptr, *descale_v = nullptr;
  const float *scale_s = nullptr, *descale_s = nullptr;
  const float *scale_o = nullptr, *descale_o = nullptr;  // descale_o: the backward's reading of o
  const float *descale_dout = nullptr, *scale_dp = nullptr, *descale_dp = nullptr;
  const float *scale_dq = nullptr, *scale_dk = nullptr, *scale_dv = nullptr;
};
struct Fp8AttentionAmaxes {
  float *s = nullptr, *o = nullptr;                             // the forward's
  float *dp = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;  // the backward's
};

// Why cuDNN does not run p's FP8 forward (or backward) on `device`, e.g. "head sizes other than 128 in the backward"
// or cuDNN's own reason; empty when it does. The first call for a problem compiles its plan.
std::string cudnn_attention_fp8_refusal(const attention::Problem& p, bool backward, DType gradient_dtype, int device);

// Queued and true when cuDNN takes the problem, false with nothing queued otherwise (there is no FP8 kernel of
// tapegrad's own to fall back to: the caller decides). log_sums: f32 [batch, q_heads, Sq], as the bf16 forward's.
bool cudnn_attention_fp8_forward(const attention::Problem& p, const void* q, const void* k, const void* v, void* o,
                                 void* log_sums, const Fp8AttentionScales& scales, const Fp8AttentionAmaxes& amaxes,
                                 int device);
bool cudnn_attention_fp8_backward(const attention::Problem& p, DType gradient_dtype, const void* q, const void* k,
                                  const void* v, const void* o, const void* log_sums, const void* dout, void* dq,
                                  void* dk, void* dv, const Fp8AttentionScales& scales,
                                  const Fp8AttentionAmaxes& amaxes, int device);

// The operations of cuDNN's graph for p's forward (or backward) in dtype (f8e4m3: the FP8 graphs, their gradients in
// gradient_dtype), a word each in order (cuda/cudnn_graph.hpp's Graph::outline), once cuDNN has checked the graph's
// form, which needs no GPU; Error with cuDNN's reason when it refuses it. For tests that hold the graphs to
// cudnn-frontend's.
std::string cudnn_attention_outline(DType dtype, const attention::Problem& p, bool backward, DType gradient_dtype);

// How many compiled plans the first calls of problems have run to choose among (set_attention_autotune), in this
// process: for tests.
std::int64_t cudnn_attention_candidates_timed();

}  // namespace tapegrad::cuda

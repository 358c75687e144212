// nn::dot_product_attention: softmax(scale·q·kᵀ + bias + mask)·v as ONE tape node, by the FlashAttention algorithm:
// the forward keeps the output and each query's log-sum-exp, the backward recomputes the probabilities block by block,
// so memory grows with the sequence length, not its square (docs/attention.md). In nn::, as jax.nn's and
// torch.nn.functional's.
//
//   // q [B, 32, S, 128], k and v [B, 8, S, 128]: grouped-query attention, causal, with dropout
//   Var<bf16> o = nn::dot_product_attention(q, k, v, {.causal = true, .dropout = 0.1, .dropout_seed = step});
//   // one projection's output [B, S, (32 + 2·8)·128] -> [B, S, 32·128]
//   Var<bf16> heads = nn::dot_product_attention_qkv(qkv, 32, 8, {.causal = true});
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tapegrad/autodiff/var.hpp"

namespace tapegrad::nn {

// Where the heads and the sequence sit in q, k, v and the output: [..., heads, S, D] or [..., S, heads, D] (the
// leading axes are the batch, the same in all three).
enum class AttentionLayout { bhsd, bshd };

// How dot_product_attention_qkv finds the heads in a row of its packed projection [..., S, (q_heads + 2·kv_heads)·D]:
// all q heads, then all k heads, then all v heads (TransformerEngine's bs3hd when the head counts are equal); or kv
// group by group, each group's q heads then its k head then its v head (Megatron-LM's grouped-query layout,
// TransformerEngine's bsh3d): a contiguous block of groups is a whole set of heads, as tensor parallelism shards them.
enum class QkvPacking { blocks, groups };

struct AttentionOptions {
  std::optional<double> scale{};  // default 1/√D
  // Query i sees keys up to its diagonal, key i + Sk - Sq (bottom-right aligned, as FlashAttention-2; the lengths
  // are a batch's own with q_lengths / kv_lengths), or key i when !bottom_right (top-left, as PyTorch's is_causal).
  bool causal = false;
  bool bottom_right = true;
  // A sliding window around the diagonal: keys [diagonal - window_left, diagonal + window_right]; -1 leaves a side open.
  std::int64_t window_left = -1, window_right = -1;
  // Per batch element, the valid queries and keys (key padding); empty: all of them. Padded queries give zeros.
  std::vector<std::int64_t> q_lengths{}, kv_lengths{};
  // Dropout on the probabilities, drawn from (dropout_seed, the probability's index in [batch, heads, Sq, Sk]) by the
  // counter-based generator: the same mask on every device, recomputed in the backward, never stored.
  double dropout = 0;
  std::uint64_t dropout_seed = 0;
  AttentionLayout layout = AttentionLayout::bhsd;  // of q, k, v and the output (dot_product_attention only)
  QkvPacking packing = QkvPacking::blocks;         // of the projection (dot_product_attention_qkv only)
  // Whether the GPU backward must give the same bits on every run: cuDNN's fastest backward sums dq in an order that
  // varies; true asks for its deterministic form. The CPU's and tapegrad's own GPU kernels always are.
  bool deterministic = false;
};

// Which kernels run a call's forward and its backward: "cpu", "cudnn" (its fused flash attention, on tensor cores),
// or "tapegrad: " and why cuDNN does not take the call (tapegrad's own GPU kernels; docs/attention.md says which
// calls cuDNN takes). Asking compiles cuDNN's plans for the call's shapes, as its first run would.
struct AttentionKernels {
  std::string forward, backward;
};

// q [..., Hq, Sq, D], k [..., Hkv, Sk, D], v [..., Hkv, Sk, Dv] (bhsd; or bshd) -> [..., Hq, Sq, Dv] (the same
// layout). Hkv divides Hq: q head h reads kv head h / (Hq / Hkv) (grouped-query and multi-query attention). q and k
// of rank 2 are one head. `bias` (optional) is added to the scaled scores: [Sq, Sk] or [B or 1, Hq or 1, Sq, Sk]
// with B the leading axes' product; it is differentiable. A query that sees no key (all masked) gives zeros.
template <class U>
Var<U> dot_product_attention(const Var<U>& q, const Var<U>& k, const Var<U>& v, const AttentionOptions& options = {},
                             const Var<U>& bias = Var<U>());

// q, k and v in one tensor, as a fused projection makes them: qkv [..., S, (q_heads + 2·kv_heads)·D], heads of D
// packed as options.packing says -> [..., S, q_heads·D] (the heads merged). options.layout does not apply.
template <class U>
Var<U> dot_product_attention_qkv(const Var<U>& qkv, std::int64_t q_heads, std::int64_t kv_heads,
                                 const AttentionOptions& options = {}, const Var<U>& bias = Var<U>());

// The kernels dot_product_attention and dot_product_attention_qkv run for these operands and options.
template <class U>
AttentionKernels dot_product_attention_kernels(const Var<U>& q, const Var<U>& k, const Var<U>& v,
                                               const AttentionOptions& options = {}, const Var<U>& bias = Var<U>());
template <class U>
AttentionKernels dot_product_attention_qkv_kernels(const Var<U>& qkv, std::int64_t q_heads, std::int64_t kv_heads,
                                                   const AttentionOptions& options = {},
                                                   const Var<U>& bias = Var<U>());

}  // namespace tapegrad::nn

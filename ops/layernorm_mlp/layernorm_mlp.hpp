// layernorm_mlp: the LayerNorm-MLP block of a transformer as ONE tape node (TransformerEngine's layout).
//
//   h = norm(x)                        layernorm (x-μ)·rσ·g + β, or rmsnorm x·rms⁻¹·g; g = γ or 1+γ; stats in f32
//   z = h · W1 + b1                    W1 [H, n, F], b1 [n, F]; n = 2 for gated activations, else 1
//   a = act(z[:, 0, :]) (· z[:, 1, :]) gated: index 0 is activated and multiplies index 1
//   y = a · W2 + b2 (+ x)              W2 [F, H], b2 [H]; x with options.residual
//
// x has any leading dims [..., H] and dtype T (the compute dtype); the parameters share one dtype P, which may
// differ (mixed precision, e.g. f32 master weights with bf16 compute): W1 and W2 are rounded to T for the
// products, and each parameter's gradient comes back in P. The backward computes dx, dγ, dβ, dW1, db1, dW2, db2
// directly, accumulating in f32 (f64 for T = f64). The algorithm and what is saved: detail/stages.hpp beside this.
#pragma once

#include <optional>
#include <string_view>
#include <variant>

#include "tapegrad/autodiff/var.hpp"
#include "tapegrad/ops/fp8/recipe.hpp"
#include "tapegrad/ops/dist.hpp"

namespace tapegrad {

enum class NormType { layernorm, rmsnorm };

enum class Activation {
  relu,
  gelu,  // the tanh form, as TransformerEngine
  silu,
  quick_gelu,    // x·σ(1.702·x)
  squared_relu,  // max(x, 0)²
  reglu,
  geglu,
  swiglu,
  glu,  // σ(z₀)·z₁
  qgeglu,
  sreglu,
  clamped_swiglu,  // GPT-OSS: z₀' = min(z₀, limit), z₁' = clamp(z₁, ±limit); a = z₀'·σ(alpha·z₀')·(z₁' + 1)
};

std::string_view activation_name(Activation activation);
// The activation with this name ("swiglu"); throws listing the names when there is none.
Activation activation_from_name(std::string_view name);
bool is_gated(Activation activation);
// The size of W1's middle axis: 2 for gated activations, else 1.
inline int activation_width(Activation activation) { return is_gated(activation) ? 2 : 1; }

// What the forward keeps for the backward; every policy gives bitwise identical gradients on the CPU.
enum class Recompute {
  save_all,        // the norm output h and the pre-activation z
  recompute_norm,  // z; h is recomputed from x and the statistics
  recompute_all,   // only x and the statistics; h and z are recomputed
};
std::string_view recompute_name(Recompute recompute);

struct ClampedSwigluParams {
  double limit = 7.0;   // clamps z₀ from above and z₁ on both sides; > 0
  double alpha = 1.702;  // the sigmoid's slope
};

// FP8 quantization of the node's GEMM inputs (options.fp8; ops/fp8/recipe.hpp): each product multiplies fp8 values
// (h and W1, a and W2 forward; dy, dz and the same fp8 h, a, W1, W2 backward) and accumulates in f32 (f64 for T = f64
// on the CPU), its result rounded to T once as without quantization. On a GPU: T in f32, bf16 or f16, every recipe.

// Tensor parallelism over the ranks of `comm` (TransformerEngine's layout and axes): each rank holds the columns of
// its shard of the FFN dimension, W1 [H, n, F/p] and b1 [n, F/p], and the matching rows of W2 [F/p, H]; γ, β and b2
// are replicated. GEMM2's partial results are summed over the ranks (b2 added once, by rank 0's).
//   tensor parallel:    x [..., H] and y replicated (the same on every rank); y all-reduced. Backward: dh
//                       all-reduced before the norm's backward.
//   + sequence_parallel: x and y sharded over tokens (each rank its own rows, all ranks the same count); h
//                       all-gathered before GEMM1, y reduce-scattered after GEMM2. Backward: dy all-gathered, dh
//                       reduce-scattered, dγ and dβ all-reduced.
// Gradients: the shards' own (dW1, db1, dW2); the replicated parameters' whole (dγ, dβ, db2: the same on every rank,
// as the unsharded node's); dx replicated (tensor parallel) or this rank's rows (sequence parallel). Every rank runs
// the node (and its backward) together, as a collective. (TensorParallel: ops/dist.hpp.)

struct LayerNormMLPOptions {
  NormType norm = NormType::layernorm;
  bool zero_centered_gamma = false;  // scale by 1 + γ
  double epsilon = 1e-6;
  Activation activation = Activation::gelu;
  ClampedSwigluParams clamped_swiglu{};
  bool return_layernorm_output = false;  // also return h, as a second differentiable result
  // y = x + the block (a pre-norm transformer's residual) in the node: x joins GEMM2's sum before its rounding to T,
  // and dy joins dx in the norm's backward, so neither the add nor the residual's gradient takes a pass of its own.
  bool residual = false;
  Recompute recompute = Recompute::save_all;
  std::optional<Fp8Quantization> fp8{};  // none: the products multiply T values
  std::optional<TensorParallel> tensor_parallel{};  // none: one process holds the whole block
};

// W1 [H, n, F] and W2 [F, H].
template <class P> struct MLPKernels {
  Var<P> w1, w2;
};
// b1 [n, F] and b2 [H]; an undefined Var (`{}`) means no bias.
template <class P> struct MLPBiases {
  Var<P> b1, b2;
};

template <class T> struct LayerNormMLPOutput {
  Var<T> y;                 // [..., H]
  Var<T> layernorm_output;  // [..., H], h; defined only with return_layernorm_output
};

// beta is `{}` for rmsnorm or a layernorm without shift. Every shape, dtype or option mismatch throws an Error
// naming both shapes.
template <class T, class P>
LayerNormMLPOutput<T> layernorm_mlp(const Var<T>& x, const Var<P>& gamma, const Var<P>& beta,
                                    const MLPKernels<P>& kernels, const MLPBiases<P>& biases,
                                    const LayerNormMLPOptions& options = {});

}  // namespace tapegrad

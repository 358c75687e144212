// Which tensor an op's products read quantized with which scale, on the CPU (the recipes of ops/fp8.hpp): for
// layernorm_mlp (ops/layernorm_mlp.cpp) and fp8_dense (ops/fp8_dense.cpp). Internal to ops/.
//
// The forward starts a step: delayed scaling first ends the state's previous one (its amaxes enter the histories, new
// scales are made), then the op keeps every role's scale for this step, so that its backward (once or again with
// retain_graph) and every recompute policy quantize with the same scales. Each tensor's amax is recorded once, by
// the pass that first quantizes it (forward: the inputs and weights; backward: the gradients).
//
// A GEMM input is read with its inner (summed) dimension along its rows or its columns. One scale per tensor reads
// the same either way; block scaling's 1×128 tiles follow the inner dimension, so an activation or a gradient is
// quantized twice, once for the product that sums over its columns and once for the weight gradient that sums over
// its rows. The weights' 128×128 blocks read the same either way. A gated block's W1 and dz ([.., n, F]) tile each of
// their n parts on its own (as TransformerEngine's, whose tiles run over n · F, where F is a multiple of 128).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <variant>

#include "tapegrad/ops/fp8.hpp"
#include "tapegrad/ops/fp8_quantize.hpp"
#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::detail {

// Which way a GEMM reads an input: its inner dimension along the input's columns or along its rows.
enum class Inner : bool { along_columns, along_rows };

// The formats a recipe quantizes to (block scaling: e4m3 everywhere).
inline fp8::Formats formats_of(const fp8::Recipe& recipe) {
  if (const auto* delayed = std::get_if<fp8::DelayedScaling>(&recipe)) return delayed->format;
  if (const auto* current = std::get_if<fp8::CurrentScaling>(&recipe)) return current->format;
  return fp8::Formats::e4m3;
}

template <class T> class Fp8Operands {
 public:
  using C = compute_t<T>;

  // `op` names the op in errors, and `name` its tensors (layernorm_mlp's by default: ops/fp8.hpp's role_name).
  Fp8Operands(std::string_view op, const Fp8Quantization& q, std::string_view (*name)(fp8::Role) = fp8::role_name)
      : op_(op), name_(name), q_(q) {
    if (auto* state = q_.state.get(); state && state->pending()) state->update();
    for (fp8::Role role : fp8::roles) scales_[index(role)] = q_.state ? q_.state->scale(role) : 1.0f;
  }

  // Whether an input's quantization depends on the way it is read.
  bool tiled() const { return std::holds_alternative<fp8::BlockScaling>(q_.recipe); }

  // Weight `role` ([rows, cols], in P, its columns `parts` equal parts) as the products read it (with a weight
  // cache: the copy it holds of w).
  template <class P>
  Tensor<C> weight(fp8::Role role, const Tensor<P>& w, std::int64_t rows, std::int64_t cols,
                   std::int64_t parts = 1) const {
    const auto quantize = [&] {
      if (!tiled()) return per_tensor(role, w, true);
      require_finite(role, amax_of(w));
      return block_quantized<C>(w, rows, cols, 128, 128, parts);
    };
    if (!q_.weight_cache) return quantize();
    return q_.weight_cache->copy<Tensor<C>>(role, w, Shape{rows, parts, cols / parts}, quantize);
  }

  // Input `role` ([rows, cols], in T, its columns `parts` equal parts) as a product reads it; `first`: the pass's
  // first quantization of this tensor, whose amax delayed scaling records.
  Tensor<C> input(fp8::Role role, const Tensor<T>& x, std::int64_t rows, std::int64_t cols, Inner inner, bool first,
                  std::int64_t parts = 1) const {
    if (!tiled()) return per_tensor(role, x, first);
    require_finite(role, amax_of(x));
    return inner == Inner::along_columns ? block_quantized<C>(x, rows, cols, 1, 128, parts)
                                         : block_quantized<C>(x, rows, cols, 128, 1);
  }
  // The same input read along its rows, given its quantization along its columns where the pass made one: with one
  // scale per tensor that is already it.
  Tensor<C> along_rows(fp8::Role role, const Tensor<T>& x, std::int64_t rows, std::int64_t cols,
                       const Tensor<C>& along_columns, bool first) const {
    if (along_columns.defined() && !tiled()) return along_columns;
    return input(role, x, rows, cols, Inner::along_rows, first);
  }

 private:
  static std::size_t index(fp8::Role role) { return static_cast<std::size_t>(role); }

  // Current and block scaling quantize with the tensor's own amax: an infinity or a NaN leaves no scale to use.
  void require_finite(fp8::Role role, float amax) const {
    check(std::isfinite(amax), op_, "fp8: ", name_(role),
          " holds an infinity or a NaN (its amax is ", amax, "), which no scale can quantize");
  }

  template <class X> Tensor<C> per_tensor(fp8::Role role, const Tensor<X>& x, bool first) const {
    const fp8::Format format = fp8::format_of(formats_of(q_.recipe), role);
    if (q_.state) {  // delayed scaling: the step's scale; the amax goes to the state, which refuses a bad one
      if (first) q_.state->record(role, amax_of(x));
      return quantized<C>(x, format, scales_[index(role)]);
    }
    const float amax = amax_of(x);
    require_finite(role, amax);
    return quantized<C>(x, format, fp8::current_scale(amax, fp8::max_value(format)));
  }

  std::string_view op_;
  std::string_view (*name_)(fp8::Role);
  Fp8Quantization q_;
  std::array<float, fp8::role_count> scales_{};
};

}  // namespace tapegrad::detail

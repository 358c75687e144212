// What a CPU product reads of a tensor, an Operand: its values in T or, quantized by an fp8 recipe, the values the
// GEMM multiplies (fp8 · (1 / scale), in C = compute_t<T>); and the Quantizer, which makes each operand as its
// recipe's policy says. The ops that multiply through GEMMs of their own (layernorm_mlp, fp8_dense) write their stages
// over operands, and read the same whatever the recipe. The GPU's counterpart: ops/fp8/detail/device_operand.hpp.
//
// A GEMM input is read with its inner (summed) dimension along its columns (the product that consumes it) or along
// its rows (a weight gradient, Aᵀ · B). One scale per tensor reads the same either way; block scaling's 1 × 128 tiles
// follow the inner dimension, so an activation or a gradient is quantized once per layout. A weight's 128 × 128 blocks
// read the same either way. A tensor whose columns are `parts` equal parts (a gated block's W1 and dz, [.., n, F])
// tiles each part from its own first column (TransformerEngine's tiles run over n · F, F a multiple of 128).
//
// The step: an op's forward makes its Quantizer, which starts one: delayed scaling first ends the state's previous
// step (its amaxes enter the histories, new scales are made); then every role's scale is kept for this step, so that
// the backward (once, or again under retain_graph) and every recompute quantize with the same scales. A tensor's amax
// counts once, on its pass's first quantization (Pass::first). With an amax group (ops/fp8/amax_group.hpp) the
// amaxes are the group's: the op calls end_pass() after each pass, where delayed scaling reduces what it held back.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include "tapegrad/ops/fp8/amax_group.hpp"
#include "tapegrad/ops/fp8/detail/quantize.hpp"
#include "tapegrad/ops/fp8/recipe.hpp"
#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::detail {

// Which layouts of an input its products read: along its columns (the product that consumes it) and along its rows
// (a weight gradient).
struct Layouts {
  bool columns = false, rows = false;
};

// Whether a quantization is its pass's first of the tensor: the one whose amax counts (delayed scaling records it,
// current scaling makes the role's scale of the step from it).
enum class Pass : bool { later, first };

template <class T> struct Operand {
  using C = compute_t<T>;
  Operand() = default;
  Operand(Tensor<T> values_) : values(std::move(values_)) {}  // (implicit: values are an operand)
  Operand(Tensor<C> columns, Tensor<C> rows) : along_columns(std::move(columns)), along_rows(std::move(rows)) {}

  bool defined() const { return values.defined() || along_columns.defined() || along_rows.defined(); }
  bool quantized() const { return !values.defined(); }
  // The layout a weight gradient reads, alone: what a forward keeps of an input for the backward.
  Operand weight_gradient_layout() const { return quantized() ? Operand({}, along_rows) : *this; }

  Tensor<T> values;                     // unquantized
  Tensor<C> along_columns, along_rows;  // quantized, per layout (the same tensor with one scale per tensor)
};

// How a recipe quantizes on the CPU; ops/fp8/recipe.hpp describes the recipes.
template <class T> class CpuRecipe {
 public:
  using C = compute_t<T>;
  virtual ~CpuRecipe() = default;
  // x [rows, cols] in the layouts asked for.
  virtual Operand<T> input(fp8::Role role, const Tensor<T>& x, std::int64_t rows, std::int64_t cols, Layouts layouts,
                           Pass pass, std::int64_t parts) const = 0;
  // A weight [rows, cols] as f32: what every quantization reads of its elements.
  virtual Tensor<C> weight(fp8::Role role, const Tensor<float>& w, std::int64_t rows, std::int64_t cols,
                           std::int64_t parts) const = 0;
  // After each pass (the forward; a backward), on every rank of the amax group together.
  virtual void end_pass() const {}

 protected:
  CpuRecipe(std::string_view op, std::string_view (*name)(fp8::Role)) : op_(op), name_(name) {}
  // Current and block scaling quantize with a tensor's own amax: an infinity or a NaN leaves no scale to use.
  void require_finite(fp8::Role role, float amax) const {
    check(std::isfinite(amax), op_, "fp8: ", name_(role), " holds an infinity or a NaN (its amax is ", amax,
          "), which no scale can quantize");
  }

 private:
  std::string_view op_;
  std::string_view (*name_)(fp8::Role);
};

// Delayed and current scaling: one scale per tensor, in the role's format.
template <class T> class PerTensorScaling : public CpuRecipe<T> {
 public:
  using C = compute_t<T>;
  Operand<T> input(fp8::Role role, const Tensor<T>& x, std::int64_t, std::int64_t, Layouts, Pass pass,
                   std::int64_t) const override {
    const Tensor<C> q = quantized<C>(x, format(role), scale(role, [&] { return amax_of(x); }, pass));
    return {q, q};
  }
  Tensor<C> weight(fp8::Role role, const Tensor<float>& w, std::int64_t, std::int64_t, std::int64_t) const override {
    return quantized<C>(w, format(role), scale(role, [&] { return amax_of(w); }, Pass::first));
  }

 protected:
  PerTensorScaling(std::string_view op, std::string_view (*name)(fp8::Role), fp8::Formats formats,
                   std::optional<fp8::AmaxGroup> group)
      : CpuRecipe<T>(op, name), group_(std::move(group)), formats_(formats) {}
  fp8::Format format(fp8::Role role) const { return fp8::format_of(formats_, role); }
  // The scale a tensor is quantized by, given its amax (taken only where the recipe reads it).
  virtual float scale(fp8::Role role, const std::function<float()>& amax, Pass pass) const = 0;

  std::optional<fp8::AmaxGroup> group_;

 private:
  fp8::Formats formats_;
};

// Delayed scaling: the step's scale of each role, made from the amaxes of the steps before; the pass's first amax of a
// role goes to the state, which refuses a bad one when the step ends. With an amax group the pass's amaxes are held
// back and reach the state at the pass's end, reduced over the group in one collective.
template <class T> class CpuDelayedScaling final : public PerTensorScaling<T> {
 public:
  CpuDelayedScaling(std::string_view op, std::string_view (*name)(fp8::Role), const Fp8Quantization& q,
                    std::optional<fp8::AmaxGroup> group)
      : PerTensorScaling<T>(op, name, fp8::formats_of(q.recipe), std::move(group)), state_(q.state) {
    if (state_->pending()) state_->update();
    for (fp8::Role role : fp8::roles) scales_[static_cast<std::size_t>(role)] = state_->scale(role);
    held_.fill(not_recorded);
  }

  void end_pass() const override {
    if (!this->group_) return;
    const std::vector<float> reduced = fp8::group_max(this->group_->comm, held_);
    held_.fill(not_recorded);
    for (fp8::Role role : fp8::roles) {
      const float amax = reduced[static_cast<std::size_t>(role)];
      if (!(amax == not_recorded)) state_->record(role, amax);  // (a NaN is recorded)
    }
  }

 private:
  static constexpr float not_recorded = -1.0f;  // below every amax: the group's maximum says whether any rank recorded

  float scale(fp8::Role role, const std::function<float()>& amax, Pass pass) const override {
    if (pass == Pass::first) {
      if (this->group_) {
        float& held = held_[static_cast<std::size_t>(role)];
        const float a = amax();
        held = std::isnan(a) || std::isnan(held) ? NAN : std::max(held, a);
      } else {
        state_->record(role, amax());
      }
    }
    return scales_[static_cast<std::size_t>(role)];
  }
  std::shared_ptr<fp8::ScalingState> state_;
  std::array<float, fp8::role_count> scales_{};
  mutable std::array<float, fp8::role_count> held_{};  // the pass's amaxes, with a group
};

// Current scaling: each tensor's scale from its own amax. With an amax group, a sharded role's amax is the group's
// maximum: reduced on the pass's first quantization, whose scale a later one (the backward's a, bitwise the same
// tensor) reuses rather than reducing again.
template <class T> class CpuCurrentScaling final : public PerTensorScaling<T> {
 public:
  CpuCurrentScaling(std::string_view op, std::string_view (*name)(fp8::Role), const Fp8Quantization& q,
                    std::optional<fp8::AmaxGroup> group)
      : PerTensorScaling<T>(op, name, fp8::formats_of(q.recipe), std::move(group)) {}

 private:
  float scale(fp8::Role role, const std::function<float()>& amax, Pass pass) const override {
    const bool reduced = this->group_ && this->group_->is_sharded(role);
    float& kept = group_scales_[static_cast<std::size_t>(role)];
    if (reduced && pass == Pass::later && kept > 0.0f) return kept;
    float a = amax();
    if (reduced) a = fp8::group_max(this->group_->comm, std::span<const float>(&a, 1)).front();
    this->require_finite(role, a);
    const float s = fp8::current_scale(a, fp8::max_value(this->format(role)));
    if (reduced) kept = s;
    return s;
  }
  mutable std::array<float, fp8::role_count> group_scales_{};  // the group's scale of each sharded role in the step
};

// Block scaling: e4m3 with a power-of-two scale per tile: 1 × 128 along the inner dimension of an input's products,
// 128 × 128 of a weight.
template <class T> class CpuBlockScaling final : public CpuRecipe<T> {
 public:
  using C = compute_t<T>;
  CpuBlockScaling(std::string_view op, std::string_view (*name)(fp8::Role)) : CpuRecipe<T>(op, name) {}
  Operand<T> input(fp8::Role role, const Tensor<T>& x, std::int64_t rows, std::int64_t cols, Layouts layouts, Pass,
                   std::int64_t parts) const override {
    this->require_finite(role, amax_of(x));
    constexpr int tile = fp8::block_tile;
    return {layouts.columns ? block_quantized<C>(x, rows, cols, 1, tile, parts) : Tensor<C>(),
            layouts.rows ? block_quantized<C>(x, rows, cols, tile, 1) : Tensor<C>()};
  }
  Tensor<C> weight(fp8::Role role, const Tensor<float>& w, std::int64_t rows, std::int64_t cols,
                   std::int64_t parts) const override {
    this->require_finite(role, amax_of(w));
    return block_quantized<C>(w, rows, cols, fp8::block_tile, fp8::block_tile, parts);
  }
};

// Makes an op's operands: the values themselves without quantization, else as the recipe's policy quantizes them.
template <class T> class Quantizer {
 public:
  using C = compute_t<T>;

  Quantizer() = default;  // no quantization
  // Starts the step of `op`'s quantization (which check_fp8_quantization has let through). `name` names its tensors in
  // errors (layernorm_mlp's by default: ops/fp8/roles.hpp's role_name).
  // With `group`, the amaxes are reduced over its ranks (ops/fp8/amax_group.hpp).
  Quantizer(std::string_view op, const Fp8Quantization& q, std::string_view (*name)(fp8::Role) = fp8::role_name,
            std::optional<fp8::AmaxGroup> group = {})
      : recipe_(recipe_of(op, q, name, std::move(group))), cache_(q.weight_cache) {}
  Quantizer(std::string_view op, const std::optional<Fp8Quantization>& q, std::optional<fp8::AmaxGroup> group = {}) {
    if (q) *this = Quantizer(op, *q, fp8::role_name, std::move(group));
  }

  // Ends a pass (the forward; a backward): with an amax group, every rank of it calls this together.
  void end_pass() const {
    if (recipe_) recipe_->end_pass();
  }

  // Weight `role` ([rows, cols], in P, its columns `parts` equal parts) as the products read it (with a weight cache,
  // the quantized copy it holds of w).
  template <class P>
  Operand<T> weight(fp8::Role role, const Tensor<P>& w, std::int64_t rows, std::int64_t cols,
                    std::int64_t parts = 1) const {
    if (!recipe_) return {cast<T>(w)};
    const auto quantize = [&] { return recipe_->weight(role, cast<float>(w), rows, cols, parts); };
    const Tensor<C> q = cache_ ? cache_->copy<Tensor<C>>(role, w, Shape{rows, parts, cols / parts}, quantize)
                               : quantize();
    return {q, q};
  }

  // Input `role` ([rows, cols], its columns `parts` equal parts) in the layouts asked for; an operand that is already
  // quantized stays as it is.
  Operand<T> input(fp8::Role role, Operand<T> x, std::int64_t rows, std::int64_t cols, Layouts layouts, Pass pass,
                   std::int64_t parts = 1) const {
    if (!recipe_ || x.quantized()) return x;
    return recipe_->input(role, x.values, rows, cols, layouts, pass, parts);
  }

 private:
  static std::shared_ptr<const CpuRecipe<T>> recipe_of(std::string_view op, const Fp8Quantization& q,
                                                       std::string_view (*name)(fp8::Role),
                                                       std::optional<fp8::AmaxGroup> group) {
    if (std::holds_alternative<fp8::DelayedScaling>(q.recipe)) {
      return std::make_shared<CpuDelayedScaling<T>>(op, name, q, std::move(group));
    }
    if (std::holds_alternative<fp8::CurrentScaling>(q.recipe)) {
      return std::make_shared<CpuCurrentScaling<T>>(op, name, q, std::move(group));
    }
    return std::make_shared<CpuBlockScaling<T>>(op, name);  // its tiles need no reduction (ops/fp8/amax_group.hpp)
  }

  std::shared_ptr<const CpuRecipe<T>> recipe_;
  std::shared_ptr<fp8::WeightCache> cache_;
};

}  // namespace tapegrad::detail

// The recipes' policies on the GPU (ops/fp8/detail/device_operand.hpp): delayed and current scaling share one scale
// per role of the step, kept on the device; block scaling writes a scale per tile beside the codes.
#include "tapegrad/ops/fp8/detail/device_operand.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/cuda/fp8_block_quantize.hpp"
#include "tapegrad/cuda/fp8_quantize.hpp"
#include "tapegrad/cuda/settings.hpp"
#include "tapegrad/cuda/strided_copy.hpp"
#include "tapegrad/ops/fp8/detail/state_on_device.hpp"
#include "tapegrad/tensor/factories.hpp"
#include "tapegrad/tensor/gpu/detail/add.hpp"
#include "tapegrad/tensor/gpu/detail/fill.hpp"

namespace tapegrad::detail {

namespace {

DType dtype_of(fp8::Format format) { return format == fp8::Format::e4m3 ? DType::f8e4m3 : DType::f8e5m2; }

std::int64_t round_up(std::int64_t n, std::int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Delayed and current scaling: one scale per role, its scale_inv, scale and amax in a row of the step's scalars.
class PerTensorScaling : public DeviceRecipe {
 public:
  Fp8Codes quantize(fp8::Role role, const QuantizeSource& x, Layouts layouts, Pass pass) const override {
    return quantize_with(role, x, layouts, pass, nullptr);
  }
  std::optional<Fp8Codes> quantize_summing_columns(fp8::Role role, const QuantizeSource& x, Layouts layouts, Pass pass,
                                                   float* column_partials) const override {
    return quantize_with(role, x, layouts, pass, column_partials);
  }
  std::optional<Fp8Codes> quantize_over(fp8::Role role, std::shared_ptr<Storage> values, const QuantizeSource& x,
                                        Pass pass) const override {
    if (x.padded_rows != x.rows || x.padded_cols != x.cols || x.cols % 8 != 0 || values->data() != x.x) {
      return std::nullopt;
    }
    Fp8Codes out = codes_for(role, x.rows, x.cols, {});
    const std::optional<cuda::Fp8CurrentScale> current = current_scale(role, x.dtype, x.x, x.rows * x.cols, pass);
    cuda::fp8_quantize_over({.dtype = x.dtype,
                             .x = values->data(),
                             .rows = x.rows,
                             .cols = x.cols,
                             .format = out.format,
                             .scale = slot(role, scale_field),
                             .current = current ? &*current : nullptr,
                             .amax = records(pass) ? amax_slot(role) : nullptr},
                            device_.index);
    out.codes = std::move(values);
    out.codes_ld = x.cols * static_cast<std::int64_t>(dtype_size(x.dtype));
    out.transpose_later = true;
    return out;
  }

 protected:
  static constexpr int scale_inv_field = 0, scale_field = 1, amax_field = 2, fields = 4;

  PerTensorScaling(std::string_view op, const Fp8Quantization& q, Device device, std::optional<fp8::AmaxGroup> group,
                   Tensor<float> scalars)
      : DeviceRecipe(op, q, device, std::move(group)), scalars_(std::move(scalars)) {}

  // quantize() with x's column sums' partial rows written to column_partials (null: none).
  Fp8Codes quantize_with(fp8::Role role, const QuantizeSource& x, Layouts layouts, Pass pass,
                         float* column_partials) const {
    const Fp8Codes out = codes_for(role, x.padded_rows, x.padded_cols, layouts);
    const std::optional<cuda::Fp8CurrentScale> current = current_scale(role, x.dtype, x.x, x.rows * x.cols, pass);
    cuda::fp8_quantize({.dtype = x.dtype,
                        .x = x.x,
                        .rows = x.rows,
                        .cols = x.cols,
                        .codes_rows = x.padded_rows,
                        .codes_cols = x.padded_cols,
                        .format = out.format,
                        .scale = slot(role, scale_field),
                        .current = current ? &*current : nullptr,
                        .codes = layouts.columns ? out.codes->data() : nullptr,
                        .transposed = layouts.rows ? out.transposed->data() : nullptr,
                        .transposed_ld = out.transposed_ld,
                        .amax = records(pass) ? amax_slot(role) : nullptr,
                        .column_partials = column_partials},
                       device_.index);
    return out;
  }

  float* slot(fp8::Role role, int field) const {
    return const_cast<float*>(scalars_.data()) + static_cast<std::int64_t>(role) * fields + field;
  }
  Fp8Codes codes_for(fp8::Role role, std::int64_t rows, std::int64_t cols, Layouts layouts) const {
    Fp8Codes out;
    out.format = format_of(role);
    out.rows = out.code_rows = rows;
    out.cols = out.codes_ld = cols;
    out.transposed_ld = round_up(rows, cuda::fp8_row_alignment);
    if (layouts.columns) out.codes = bytes(rows * cols);
    if (layouts.rows) out.transposed = bytes(cols * out.transposed_ld);
    out.scale_inv = slot(role, scale_inv_field);
    out.scalars = scalars_;
    return out;
  }
  // Current scaling: the pass's first quantization of a role makes the role's scale from the tensor's amax.
  virtual std::optional<cuda::Fp8CurrentScale> current_scale(fp8::Role, DType, const void*, std::int64_t,
                                                              Pass) const {
    return std::nullopt;
  }
  // Whether the quantization merges the tensor's amax into the role's: delayed scaling records the pass's first.
  virtual bool records(Pass) const { return false; }
  // Where it merges it.
  virtual float* amax_slot(fp8::Role role) const { return slot(role, amax_field); }

  Tensor<float> scalars_;  // [role_count, fields]; scale_inv first: 16-byte aligned, as cuBLASLt reads it
};

// The state's scales and amaxes stay on the device (ops/fp8/detail/state_on_device.hpp): the step's scalars are
// written there from them, and each quantization merges its amax there.
class DelayedScaling final : public PerTensorScaling {
 public:
  DelayedScaling(std::string_view op, const Fp8Quantization& q, Device device, std::optional<fp8::AmaxGroup> group)
      : PerTensorScaling(op, q, device, std::move(group), Tensor<float>(Shape{fp8::role_count, fields}, device)) {
    state().begin_step(scalars_.data(), fields, scale_inv_field, scale_field);
  }

  // With an amax group: the amaxes recorded so far, their maximum over the ranks (one collective a pass).
  void end_pass() const override {
    if (group_) state().reduce_over(group_->comm);
  }

  std::optional<Fp8Target> target(fp8::Role role, std::int64_t rows, std::int64_t cols, Layouts layouts,
                                  Pass pass) const override {
    Fp8Target out;
    out.codes = codes_for(role, rows, cols, layouts);
    out.scale = slot(role, scale_field);
    out.amax = records(pass) ? amax_slot(role) : nullptr;
    return out;
  }

 private:
  // (asked for at each use: a read of the state on the host between passes brings it home, and the next use here
  // takes it to the device again)
  DelayedStateOnDevice& state() const { return delayed_state_on(*q_.state, device_); }
  bool records(Pass pass) const override { return pass == Pass::first; }
  float* amax_slot(fp8::Role role) const override { return state().amax(role); }
};

class CurrentScaling final : public PerTensorScaling {
 public:
  // Each quantization makes its own scale: nothing to upload, so that a graph can capture the step.
  CurrentScaling(std::string_view op, const Fp8Quantization& q, Device device, std::optional<fp8::AmaxGroup> group)
      : PerTensorScaling(op, q, device, std::move(group), Tensor<float>(Shape{fp8::role_count, fields}, device)),
        amaxes_(Shape{fp8::role_count}, device) {}

  // A role that is not sharded (its amax is this rank's alone): the amax is merged by the kernel that makes the
  // tensor, which spares the quantization a pass over it.
  float* amax_target(fp8::Role role, Pass pass) const override {
    if (pass != Pass::first || (group_ && group_->is_sharded(role))) return nullptr;
    made_[index(role)] = true;
    return accumulator(role);
  }
  void end_pass() const override {
    stale_ = true;
    made_ = {};
  }
  // A later pass's codes (the backward's of a forward input made again): the step's scale is the first pass's, known
  // before the tensor is made again.
  std::optional<Fp8Target> target(fp8::Role role, std::int64_t rows, std::int64_t cols, Layouts layouts,
                                  Pass pass) const override {
    if (pass == Pass::first) return std::nullopt;
    return Fp8Target{.codes = codes_for(role, rows, cols, layouts), .scale = slot(role, scale_field)};
  }

 private:
  static std::size_t index(fp8::Role role) { return static_cast<std::size_t>(role); }

  // The tensor's amax (its maker's, else found here; a sharded role's, with an amax group, every rank's gathered and
  // their maximum taken by the same kernel), from which the quantization makes the scale.
  std::optional<cuda::Fp8CurrentScale> current_scale(fp8::Role role, DType dtype, const void* x, std::int64_t n,
                                                      Pass pass) const override {
    if (pass != Pass::first) return std::nullopt;
    const cuda::Fp8CurrentScale out{amaxes_.data() + index(role), slot(role, scale_field), slot(role, scale_inv_field)};
    if (std::exchange(made_[index(role)], false)) return out;
    Tensor<float> ranks_amaxes;  // (alive until the kernel below is queued)
    if (group_ && group_->is_sharded(role)) {
      Tensor<float> mine(Shape{1}, device_);
      cuda::fill(DType::f32, mine.data(), 1, 0.0, device_.index);
      cuda::fp8_amax(dtype, x, n, mine.data(), device_.index);
      ranks_amaxes = group_->comm.all_gather(mine);
      x = ranks_amaxes.data();
      n = ranks_amaxes.numel();
      dtype = DType::f32;
    }
    cuda::fp8_amax(dtype, x, n, accumulator(role), device_.index);
    return out;
  }

  // Role's amax accumulator, zero: one fill zeroes all of them at a pass's first use (the step's start leaves them
  // unset, a pass its amaxes), a role's own again where a pass quantizes the role twice.
  float* accumulator(fp8::Role role) const {
    float* amaxes = const_cast<float*>(amaxes_.data());
    float* amax = amaxes + index(role);
    if (stale_) {
      cuda::fill(DType::f32, amaxes, fp8::role_count, 0.0, device_.index);
      stale_ = false;
      used_ = {};
    } else if (used_[index(role)]) {
      cuda::fill(DType::f32, amax, 1, 0.0, device_.index);
    }
    used_[index(role)] = true;
    return amax;
  }

  Tensor<float> amaxes_;  // [role_count]: the amaxes the pass's scales are made from
  // What the host has queued on them (the host knows, in stream order): whether a fill must come before the next use,
  // which roles' accumulators the pass has used, which hold an amax their tensor's maker merged.
  mutable bool stale_ = true;
  mutable std::array<bool, fp8::role_count> used_{}, made_{};
};

// Block scaling: e4m3 codes with a scale per tile of fp8::block_tile, made by the same pass as the codes.
class BlockScaling final : public DeviceRecipe {
 public:
  // Its tiles need no amax reduction (ops/fp8/amax_group.hpp).
  BlockScaling(std::string_view op, const Fp8Quantization& q, Device device) : DeviceRecipe(op, q, device, {}) {}

  Fp8Codes quantize(fp8::Role role, const QuantizeSource& x, Layouts layouts, Pass) const override {
    const Fp8Codes out = codes_for(role, x.padded_rows, x.padded_cols, layouts);
    cuda::fp8_block_quantize({.dtype = x.dtype,
                              .x = x.x,
                              .rows = x.rows,
                              .cols = x.cols,
                              .scaling = out.scaling,
                              .codes = data(out.codes),
                              .codes_rows = out.code_rows,
                              .codes_cols = x.padded_cols,
                              .scales = floats(out.scales),
                              .transposed = data(out.transposed),
                              .transposed_ld = out.transposed_ld,
                              .transposed_scales = floats(out.transposed_scales)},
                             device_.index);
    return out;
  }
  // A forward input's codes in one layout, 1×128 tiles along its rows, which a kernel that writes whole rows in whole
  // tiles can quantize itself (with rows a multiple of 4: no padding rows to write). Not a weight's (blocks), nor a
  // gradient's (the backward's kernels write one scale per tensor).
  std::optional<Fp8Target> target(fp8::Role role, std::int64_t rows, std::int64_t cols, Layouts layouts,
                                  Pass) const override {
    if (fp8::is_weight(role) || fp8::is_gradient(role) || layouts.rows || rows % 4 != 0 ||
        cols % fp8::block_tile != 0) {
      return std::nullopt;
    }
    return Fp8Target{.codes = codes_for(role, rows, cols, layouts)};
  }
  std::int64_t granule() const override { return fp8::block_tile; }

 private:
  static void* data(const std::shared_ptr<Storage>& s) { return s ? s->data() : nullptr; }
  static float* floats(const std::shared_ptr<Storage>& s) { return static_cast<float*>(data(s)); }

  Fp8Codes codes_for(fp8::Role role, std::int64_t rows, std::int64_t cols, Layouts layouts) const {
    Fp8Codes out;
    out.format = DType::f8e4m3;
    out.rows = rows;
    out.cols = out.codes_ld = cols;
    out.code_rows = round_up(rows, 4);
    out.transposed_ld = round_up(rows, fp8::block_tile);
    out.scaling = fp8::is_weight(role) ? cuda::Fp8Scaling::blocks_128x128 : cuda::Fp8Scaling::tiles_1x128;
    const auto scales_of = [&](std::int64_t outer, std::int64_t K) {
      return bytes(cuda::fp8_scale_shape(out.scaling, outer, K).count() * std::int64_t{sizeof(float)});
    };
    if (layouts.columns) {
      out.codes = bytes(out.code_rows * cols);
      out.scales = scales_of(out.code_rows, cols);
    }
    if (layouts.rows) {
      out.transposed = bytes(cols * out.transposed_ld);
      out.transposed_scales = scales_of(cols, out.transposed_ld);
    }
    return out;
  }
};

}  // namespace

std::optional<Fp8Target> DeviceRecipe::target(fp8::Role, std::int64_t, std::int64_t, Layouts, Pass) const {
  return std::nullopt;
}

float* DeviceRecipe::amax_target(fp8::Role, Pass) const { return nullptr; }

std::optional<Fp8Codes> DeviceRecipe::quantize_summing_columns(fp8::Role, const QuantizeSource&, Layouts, Pass,
                                                               float*) const {
  return std::nullopt;
}

std::optional<Fp8Codes> DeviceRecipe::quantize_over(fp8::Role, std::shared_ptr<Storage>, const QuantizeSource&,
                                                    Pass) const {
  return std::nullopt;
}

Fp8Codes transposed_from_codes(Fp8Codes c) {
  check(c.codes && c.scaling == cuda::Fp8Scaling::tensor, "fp8", "a transpose made from codes needs per-tensor codes");
  const Device device = c.codes->device();
  c.transposed_ld = round_up(c.rows, cuda::fp8_row_alignment);
  c.transposed = Storage::allocate(static_cast<std::size_t>(c.cols * c.transposed_ld), device);
  cuda::fp8_transpose(c.codes->data(), c.rows, c.cols, c.codes_ld, c.transposed->data(), c.transposed_ld, device.index);
  c.codes.reset();
  c.codes_ld = 0;
  c.transpose_later = false;
  return c;
}

std::shared_ptr<Storage> DeviceRecipe::bytes(std::int64_t count) const {
  return Storage::allocate(static_cast<std::size_t>(count), device_);
}

DType DeviceRecipe::format_of(fp8::Role role) const {
  return dtype_of(fp8::format_of(fp8::formats_of(q_.recipe), role));
}

std::unique_ptr<const DeviceRecipe> device_recipe(std::string_view op, const Fp8Quantization& q, Device device,
                                                  std::optional<fp8::AmaxGroup> group) {
  if (std::holds_alternative<fp8::DelayedScaling>(q.recipe)) {
    return std::make_unique<DelayedScaling>(op, q, device, std::move(group));
  }
  if (std::holds_alternative<fp8::CurrentScaling>(q.recipe)) {
    return std::make_unique<CurrentScaling>(op, q, device, std::move(group));
  }
  return std::make_unique<BlockScaling>(op, q, device);
}

void DeviceRecipe::product(const Fp8Codes& a, Fp8Layout a_layout, const Fp8Codes& b, Fp8Layout b_layout,
                           std::int64_t M, std::int64_t N, std::int64_t K, DType out_dtype, void* out,
                           const void* bias, const void* addend, bool forward, std::int64_t a_first_row) const {
  check(a_first_row == 0 || (a_layout == Fp8Layout::codes && a.scaling == cuda::Fp8Scaling::tensor &&
                             a_first_row + M <= a.rows),
        op_, "an fp8 product over rows ", a_first_row, " .. ", a_first_row + M, " of ", a.rows,
        " reads codes with one scale per tensor, in their own layout");
  struct Operand {
    const void* data;
    std::int64_t ld;
    const float* scale_inv;
  };
  const auto operand = [](const Fp8Codes& x, Fp8Layout layout) {
    const auto scales = [&](const std::shared_ptr<Storage>& s) {
      return s ? static_cast<const float*>(s->data()) : x.scale_inv;
    };
    return layout == Fp8Layout::codes ? Operand{x.codes->data(), x.codes_ld, scales(x.scales)}
                                      : Operand{x.transposed->data(), x.transposed_ld, scales(x.transposed_scales)};
  };
  for (const auto& [x, layout] : {std::pair{&a, a_layout}, std::pair{&b, b_layout}}) {
    check((layout == Fp8Layout::codes ? x->codes : x->transposed) != nullptr, op_, "an fp8 product reads the ",
          layout == Fp8Layout::codes ? "codes" : "transposed codes", " of an operand that does not hold them");
  }
  Operand A = operand(a, a_layout);
  A.data = static_cast<const std::uint8_t*>(A.data) + a_first_row * A.ld;
  const Operand B = operand(b, b_layout);
  const bool tiled = a.scaling != cuda::Fp8Scaling::tensor || b.scaling != cuda::Fp8Scaling::tensor;
  // Block scaling: A's codes may carry zero rows past M (code_rows); the product then writes them too, to scratch.
  const std::int64_t rows = a_layout == Fp8Layout::codes && a.scaling != cuda::Fp8Scaling::tensor ? a.code_rows : M;
  std::shared_ptr<Storage> scratch;
  void* c = out;
  if (rows != M) {
    scratch = bytes(rows * N * static_cast<std::int64_t>(dtype_size(out_dtype)));
    c = scratch->data();
  }
  // cuBLASLt's FP8 kernels add no f32 bias, nor any with block scaling (cuda/blaslt.hpp): the bias becomes C's
  // initial rows instead. An addend that C cannot be (C holds the bias, or has more rows) is added after the product.
  const bool c_holds_bias = bias && (out_dtype == DType::f32 || tiled) && rows > 0;
  if (c_holds_bias) {
    cuda::strided_copy(out_dtype, bias, c, {{rows, 0, N}, {N, 1, 1}}, device_.index);
    bias = nullptr;
  }
  const void* added_after = nullptr;
  if (addend && (c_holds_bias || c != out)) std::swap(added_after, addend);

  const cuda::GemmFp8 fp8{.a = a.format,
                          .b = b.format,
                          .a_scale_inv = A.scale_inv,
                          .b_scale_inv = B.scale_inv,
                          .fast_accumulation = forward && q_.fast_forward_accumulation && !tiled,
                          .a_scaling = a.scaling,
                          .b_scaling = b.scaling};
  cuda::gemm({.dtype = out_dtype,
              .M = rows,
              .N = N,
              .K = K,
              .a = {A.data, A.ld, 0, false},
              .b = {B.data, B.ld, 0, true},
              .c = {c, N, 0},
              .beta = c_holds_bias || addend ? 1.0 : 0.0,
              .addend = addend,
              .bias = bias,
              .fp8 = &fp8},
             device_.index);
  if (c != out) cuda::strided_copy(out_dtype, c, out, {{M, N, N}, {N, 1, 1}}, device_.index);
  if (added_after) cuda::add(out_dtype, out, added_after, out, M * N, device_.index);
}

void DeviceRecipe::gelu_product(const Fp8Codes& a, const Fp8Codes& b, std::int64_t M, std::int64_t N, std::int64_t K,
                                DType dtype, const void* bias, void* gelu_input, const Fp8Target& out) const {
  // cuBLASLt sets its amax rather than merging it: into a scratch float, merged after.
  Tensor<float> amax(Shape{out.amax ? 1 : 0}, device_);
  const cuda::GemmFp8 fp8{.a = a.format,
                          .b = b.format,
                          .a_scale_inv = a.scale_inv,
                          .b_scale_inv = b.scale_inv,
                          .fast_accumulation = q_.fast_forward_accumulation,
                          .c_codes = out.codes.format,
                          .c_scale = out.scale,
                          .c_amax = out.amax ? amax.data() : nullptr};
  cuda::gemm({.dtype = dtype,
              .M = M,
              .N = N,
              .K = K,
              .a = {a.codes->data(), a.codes_ld, 0, false},
              .b = {b.transposed->data(), b.transposed_ld, 0, true},
              .c = {out.codes.codes->data(), N, 0},
              .bias = bias,
              .gelu_input = gelu_input,
              .fp8 = &fp8},
             device_.index);
  if (out.amax) cuda::fp8_amax(DType::f32, amax.data(), 1, out.amax, device_.index);
}

bool quantizes_on_gpu(const Fp8Quantization& q, const fp8::StepWork& work) {
  return cuda::fp8_dispatch() == cuda::Fp8Dispatch::always || fp8::pays_on_gpu(q, work);
}

}  // namespace tapegrad::detail

// What a GPU product reads of a tensor, a DeviceOperand: its values in T or, quantized by an fp8 recipe, its fp8 codes
// on the device with their scales; the recipes' policies on the GPU (DeviceRecipe); and the DeviceQuantizer, which
// makes each operand as its recipe says and multiplies operands with cuBLASLt. The CPU's counterpart, whose bits these
// follow: ops/fp8/detail/operand.hpp. Internal to ops/.
//
// A step's scales live on the device, per role: delayed scaling's come from its state, which stays on the device
// between steps (ops/fp8/detail/state_on_device.hpp: the step's amaxes merge there, a kernel ends the step there);
// current scaling makes each from the tensor's amax there, in the quantizing kernel itself, the amax merged by the
// kernel that made the tensor where it can be (DeviceRecipe::amax_target), else by a pass of its own. Nothing waits
// for the device, so a CUDA graph can capture a step. Delayed scaling knows each scale before the tensor exists, so a
// kernel that makes a tensor can write its codes itself (DeviceRecipe::target), as can one that makes whole rows of
// block scaling's tiles. With an amax group (ops/fp8/amax_group.hpp) the amaxes are the group's, reduced on the
// device over NCCL: delayed scaling's at the end of each pass (the step's amaxes so far, one collective), current
// scaling's for a sharded role before its scale is made, by a kernel over the gathered amaxes.
// Hopper's FP8 kernels read both operands along the inner dimension, so a tensor that one product sums over its
// columns and another over its rows is written twice by one pass: its codes and their transpose (TransformerEngine's
// cast + transpose). Block scaling's tiles follow each product's inner dimension, so the two layouts have scales of
// their own, made by the same pass (cuda/fp8_block_quantize.hpp), read by cuBLASLt's block-scaled modes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <type_traits>

#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/cuda/fp8_quantize.hpp"
#include "tapegrad/cuda/partial_sums.hpp"
#include "tapegrad/ops/detail/device_tensors.hpp"
#include "tapegrad/ops/fp8/detail/operand.hpp"
#include "tapegrad/ops/fp8/gpu_dispatch.hpp"
#include "tapegrad/ops/fp8/recipe.hpp"
#include "tapegrad/ops/detail/gemm.hpp"
#include "tapegrad/tensor/storage.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::detail {

// The fp8 codes of one [rows, cols] row-major matrix on the device, its transpose [cols, transposed_ld] (zero past
// `rows`, which it rounds up to cuda::fp8_row_alignment, with block scaling to whole tiles), or both, and the
// dequantization scale its role has in the step; with block scaling, each layout's tiles' scales instead (laid out as
// cuda/blaslt.hpp's `scaling` says), and the codes' rows `code_rows` (zero past `rows`): cuBLASLt's block-scaled
// products read an operand's 1×128 scales in rows of exactly its row count, which must keep them 16-byte aligned, a
// multiple of 4. The codes' rows are codes_ld bytes apart: cols, or more where they were written over wider values
// (DeviceRecipe::quantize_over), whose transpose is made from them when the layout a weight gradient reads is asked
// for (transpose_later).
struct Fp8Codes {
  DType format = DType::f8e4m3;
  std::shared_ptr<Storage> codes, transposed;
  std::int64_t rows = 0, cols = 0, code_rows = 0, codes_ld = 0, transposed_ld = 0;
  bool transpose_later = false;
  const float* scale_inv = nullptr;
  Tensor<float> scalars;  // what scale_inv points into, kept with the codes (a weight cache keeps them past the step)
  cuda::Fp8Scaling scaling = cuda::Fp8Scaling::tensor;
  std::shared_ptr<Storage> scales, transposed_scales;
};

// Which of an input's two layouts a product reads.
enum class Fp8Layout : bool { codes, transposed };

// c's transpose made from its codes (per-tensor scales: the same codes, moved), the codes given up.
Fp8Codes transposed_from_codes(Fp8Codes c);

template <class T> struct DeviceOperand {
  DeviceOperand() = default;
  DeviceOperand(Tensor<T> values_) : values(std::move(values_)) {}  // (implicit: values are an operand)
  DeviceOperand(Fp8Codes codes_) : codes(std::move(codes_)) {}

  bool defined() const { return values.defined() || codes.codes || codes.transposed; }
  bool quantized() const { return !values.defined(); }
  // The layout a weight gradient reads, alone: what a forward keeps of an input for the backward (made here from the
  // codes where they were quantized over their values).
  DeviceOperand weight_gradient_layout() const {
    if (codes.transpose_later) return DeviceOperand(transposed_from_codes(codes));
    DeviceOperand out = *this;
    out.codes.codes.reset();
    out.codes.scales.reset();
    return out;
  }
  // A weight after its forward product, which read its transpose: what the backward's input gradient reads (the
  // codes) is kept, the transpose (and block scaling's scales of it) goes.
  void give_up_transpose() {
    codes.transposed.reset();
    codes.transposed_scales.reset();
  }

  Tensor<T> values;  // unquantized
  Fp8Codes codes;    // quantized: `codes` read along the columns, `transposed` along the rows
};

// Where the kernel that makes a tensor writes its codes itself: the codes, the scale to quantize by, and, on the
// pass's first quantization of the role, the amax to merge |x| into (recorded as quantize records it; else null);
// with block scaling (codes.scaling not tensor) the codes and their tiles' scales, which the kernel makes.
struct Fp8Target {
  Fp8Codes codes;
  const float* scale = nullptr;
  float* amax = nullptr;
};

// What a recipe quantizes: x [rows, cols] row-major (f32, bf16 or f16 on the device) as the top left corner of codes
// [padded_rows, padded_cols], zero codes elsewhere (a padded operand without a padded copy of x).
struct QuantizeSource {
  DType dtype = DType::f32;
  const void* x = nullptr;
  std::int64_t rows = 0, cols = 0, padded_rows = 0, padded_cols = 0;
};

// How a recipe quantizes on the GPU (ops/fp8/recipe.hpp describes the recipes; device_operand.cpp has one policy each).
class DeviceRecipe {
 public:
  virtual ~DeviceRecipe() = default;
  const Fp8Quantization& quantization() const { return q_; }
  Device device() const { return device_; }

  // x quantized for `role`, in the layouts asked for (codes for `columns`, the transpose for `rows`). A pass's first
  // quantization of a tensor makes the role's scale from its amax (current scaling) or records its amax (delayed); a
  // later one (the backward's, a recompute's) uses the step's scale.
  virtual Fp8Codes quantize(fp8::Role role, const QuantizeSource& x, Layouts layouts, Pass pass) const = 0;
  // x quantized as quantize() does, by a pass that also writes x's column sums, one partial row per 64 of its rows
  // ([cuda::fp8_column_partial_rows(x.rows), x.cols] f32, cuda::Fp8Quantize's column_partials); none where the
  // recipe cannot (block scaling's quantization works on other tiles).
  virtual std::optional<Fp8Codes> quantize_summing_columns(fp8::Role role, const QuantizeSource& x, Layouts layouts,
                                                           Pass pass, float* column_partials) const;
  // x's codes along its columns written over x itself (`values`, x's storage, which they then keep: x is given up),
  // row by row, so that they take no memory beside x's; their transpose is made from them later (transpose_later),
  // once a product has read them and memory is freer. None where the recipe cannot (block scaling's tiles, which
  // differ between the layouts), or x is padded: quantize() then.
  virtual std::optional<Fp8Codes> quantize_over(fp8::Role role, std::shared_ptr<Storage> values,
                                                const QuantizeSource& x, Pass pass) const;
  // Where a kernel that makes role's tensor [rows, cols] can write its codes in the layouts asked for; none where the
  // recipe has no scale before the tensor exists (the kernel writes values, which quantize() reads): delayed
  // scaling's, current scaling's in a later pass (the first made the step's scale), and block scaling's for one
  // layout of whole tiles along the rows, whose scales the kernel makes.
  virtual std::optional<Fp8Target> target(fp8::Role role, std::int64_t rows, std::int64_t cols, Layouts layouts,
                                          Pass pass) const;
  // Where the kernel that makes role's tensor (the pass's first of the role) merges its amax, so that quantize() needs
  // no pass of its own to find it: current scaling's, for a role whose amax is this rank's alone; null elsewhere.
  // Only for a tensor that quantize() then takes whole, in this pass.
  virtual float* amax_target(fp8::Role role, Pass pass) const;
  // What the recipe's products need an operand's rows and inner size to be a multiple of.
  virtual std::int64_t granule() const { return cuda::fp8_row_alignment; }
  // After each pass (the forward; a backward), on every rank of the amax group together.
  virtual void end_pass() const {}

  // out [M, N] (`out_dtype`: f32, bf16 or f16) = A · Bᵀ (+ bias on every row, in out_dtype, unless null) (+ addend,
  // [M, N] in out_dtype, unless null) where A [M, K] and B [N, K] are the given layouts of a and b, accumulated in f32
  // (a forward product with fewer bits between partial sums where the quantization's fast_forward_accumulation asks
  // for it, per-tensor scales only). A starts at a's row `a_first_row` (a's codes with one scale: a product over some
  // of its rows). The addend joins the sum before its rounding, but where the bias cannot (block scaling, f32 out):
  // then it is added to the rounded sum.
  void product(const Fp8Codes& a, Fp8Layout a_layout, const Fp8Codes& b, Fp8Layout b_layout, std::int64_t M,
               std::int64_t N, std::int64_t K, DType out_dtype, void* out, const void* bias, const void* addend,
               bool forward, std::int64_t a_first_row = 0) const;
  // A forward product with GELU in its epilogue, written as codes: out's codes [M, N] = fp8(gelu(sum) · scale), the
  // sum = a · bᵀ + bias (read as product() reads a's codes and b's transpose) rounded to `dtype` (bf16 or f16) into
  // gelu_input [M, N], and |gelu(sum)|'s maximum merged into out's amax where it has one. `out` is a per-tensor
  // target (delayed scaling's: a scale known before the product).
  void gelu_product(const Fp8Codes& a, const Fp8Codes& b, std::int64_t M, std::int64_t N, std::int64_t K, DType dtype,
                    const void* bias, void* gelu_input, const Fp8Target& out) const;

 protected:
  DeviceRecipe(std::string_view op, const Fp8Quantization& q, Device device, std::optional<fp8::AmaxGroup> group)
      : op_(op), q_(q), device_(device), group_(std::move(group)) {}
  std::shared_ptr<Storage> bytes(std::int64_t count) const;
  DType format_of(fp8::Role role) const;

  std::string_view op_;
  Fp8Quantization q_;
  Device device_;
  std::optional<fp8::AmaxGroup> group_;
};

// The policy of q's recipe, starting op's step on `device` (delayed scaling first ends the state's previous one), for
// a recipe and dtype that check_fp8_on_device has let through. `op` names it in errors; with `group`, the amaxes are
// reduced over its ranks.
std::unique_ptr<const DeviceRecipe> device_recipe(std::string_view op, const Fp8Quantization& q, Device device,
                                                  std::optional<fp8::AmaxGroup> group = {});

// out [M, N] = op(A) · op(B) (+ addend, laid out as out; + bias on every row; each unless null) over values,
// row-major: A stored [M, K], or [K, M] when transposed; B stored [K, N], or [N, K] when transposed. out, the addend
// and the bias in T, or, wide, in T's compute type (the f32 accumulation of 16-bit products rounded once to f32).
// With gelu_input, out = GELU of the sum and the sum goes to gelu_input (cuBLASLt's GELU_AUX_BIAS epilogue).
template <class T>
void values_product(const Tensor<T>& a, bool transpose_a, const Tensor<T>& b, bool transpose_b, std::int64_t M,
                    std::int64_t N, std::int64_t K, const void* bias, const void* addend, void* out, bool wide = false,
                    void* gelu_input = nullptr) {
  cuda::gemm({.dtype = dtype_v<T>,
              .M = M,
              .N = N,
              .K = K,
              .a = {a.data(), transpose_a ? M : K, 0, transpose_a},
              .b = {b.data(), transpose_b ? K : N, 0, transpose_b},
              .c = {out, N, 0},
              .beta = addend ? 1.0 : 0.0,
              .addend = addend,
              .bias = bias,
              .gelu_input = gelu_input,
              .wide_output = wide},
             a.device().index);
}

// Makes an op's operands on the GPU: the values themselves without quantization, else as the recipe's policy
// quantizes them; and multiplies them.
template <class T> class DeviceQuantizer {
 public:
  DeviceQuantizer() = default;  // no quantization
  DeviceQuantizer(std::string_view op, const std::optional<Fp8Quantization>& q, Device device,
                  std::optional<fp8::AmaxGroup> group = {})
      : recipe_(q ? device_recipe(op, *q, device, std::move(group)) : nullptr) {}

  // Ends a pass (the forward; a backward): with an amax group, every rank of it calls this together.
  void end_pass() const {
    if (recipe_) recipe_->end_pass();
  }

  // n rounded up to what a product needs of an operand's rows and inner size: 16 bytes of T (cuBLASLt's TMA kernels
  // need 16-byte aligned rows; without them it falls back to kernels ~3× slower), of fp8 codes, or whole tiles.
  std::int64_t padded(std::int64_t n) const {
    const std::int64_t granule = recipe_ ? recipe_->granule() : 16 / static_cast<std::int64_t>(sizeof(T));
    return (n + granule - 1) / granule * granule;
  }

  // Weight `role` [shape] (in P) padded to `padded`, as the products read it: rounded to T (its padding queued on
  // `pads`), or quantized from P itself where the kernels read it (as the CPU quantizes it), f64 by way of f32 (which
  // is what the CPU's quantization reads of it), in the layouts asked for (a later pass: at the step's scale); with a
  // weight cache, the copy it holds of w, in both layouts.
  template <class P>
  DeviceOperand<T> weight(fp8::Role role, const Tensor<P>& w, const Shape& shape, const Shape& padded,
                          Resizes<T>& pads, Layouts layouts = {.columns = true, .rows = true},
                          Pass pass = Pass::first) const {
    if (!recipe_) return pads.add(cast<T>(w).reshape(shape), padded);
    const auto quantize = [&](Layouts wanted) {
      using Q = std::conditional_t<std::is_same_v<P, double>, float, P>;
      const Tensor<Q> wq = cast<Q>(w);
      const std::int64_t rows = shape.dim(0), padded_rows = padded.dim(0), last = shape.dim(shape.rank() - 1);
      const std::int64_t cols = shape.numel() / rows, padded_cols = padded.numel() / padded_rows;
      // A row of one part is padded at its end, by the quantization itself; a gated W1's two parts each, by a copy.
      if (cols == last) return recipe_->quantize(role, {dtype_v<Q>, wq.data(), rows, cols, padded_rows, padded_cols},
                                                 wanted, pass);
      const Tensor<Q> wp = resized(wq.reshape(shape), padded);
      return recipe_->quantize(role, {dtype_v<Q>, wp.data(), padded_rows, padded_cols, padded_rows, padded_cols},
                               wanted, pass);
    };
    if (!caches_weights()) return quantize(layouts);
    // (a cached copy serves every product: both layouts)
    return recipe_->quantization().weight_cache->copy<Fp8Codes>(role, w, padded, [&] {
      return quantize({.columns = true, .rows = true});
    });
  }
  // Whether weight() keeps the weights' codes from op to op (in both layouts), in a weight cache.
  bool caches_weights() const { return recipe_ && recipe_->quantization().weight_cache; }

  // Input `role` (values [rows, cols], padded) in the layouts asked for; an operand that is already quantized stays
  // as it is.
  DeviceOperand<T> input(fp8::Role role, DeviceOperand<T> x, Layouts layouts, Pass pass) const {
    if (!recipe_ || x.quantized()) return x;
    const std::int64_t rows = x.values.dim(0), cols = x.values.numel() / std::max<std::int64_t>(rows, 1);
    return recipe_->quantize(role, {dtype_v<T>, x.values.data(), rows, cols, rows, cols}, layouts, pass);
  }

  // Input `role` (values [rows, cols]) as input() quantizes it, and its column sums (a bias gradient: Σ over the rows
  // in f32, rounded once to P, the first sums_shape.numel() columns) from the same pass, where the recipe can
  // (DeviceRecipe::quantize_summing_columns); elsewhere `sums` is left undefined and x is not quantized.
  template <class P>
  std::optional<DeviceOperand<T>> input_summing_columns(fp8::Role role, const Tensor<T>& x, Layouts layouts, Pass pass,
                                                        const Shape& sums_shape, Tensor<P>& sums) const {
    if (!recipe_) return std::nullopt;
    const std::int64_t rows = x.dim(0), cols = x.numel() / std::max<std::int64_t>(rows, 1);
    Tensor<float> partials(Shape{cuda::fp8_column_partial_rows(rows), cols}, x.device());
    std::optional<Fp8Codes> codes = recipe_->quantize_summing_columns(
        role, {dtype_v<T>, x.data(), rows, cols, rows, cols}, layouts, pass, partials.data());
    if (!codes) return std::nullopt;
    ParamGrad<P, T> out(sums_shape, Shape{cols}, x.device());
    const cuda::PartialSums sum{partials.data(), out.data()};
    cuda::sum_partials(ParamGrad<P, T>::wide ? dtype_v<compute_t<T>> : dtype_v<T>, {&sum, 1}, partials.dim(0), cols,
                       x.device().index);
    sums = out.result();
    return DeviceOperand<T>(std::move(*codes));
  }

  // Input `role` (values [rows, cols], which no other tensor shares) in both layouts, its codes along the columns
  // written over its own values where the recipe can (DeviceRecipe::quantize_over), else beside them.
  DeviceOperand<T> input_over(fp8::Role role, DeviceOperand<T> x, Pass pass) const {
    if (recipe_ && !x.quantized() && x.values.owns_storage_alone()) {
      const std::int64_t rows = x.values.dim(0), cols = x.values.numel() / std::max<std::int64_t>(rows, 1);
      const QuantizeSource source{dtype_v<T>, x.values.data(), rows, cols, rows, cols};
      if (auto codes = recipe_->quantize_over(role, x.values.storage(), source, pass)) return std::move(*codes);
    }
    return input(role, std::move(x), {.columns = true, .rows = true}, pass);
  }

  // Where the kernel that makes role's tensor writes its codes itself, where the recipe can say so before the tensor
  // exists (DeviceRecipe::target).
  std::optional<Fp8Target> target(fp8::Role role, std::int64_t rows, std::int64_t cols, Layouts layouts,
                                  Pass pass) const {
    return recipe_ ? recipe_->target(role, rows, cols, layouts, pass) : std::nullopt;
  }

  // Where the kernel that makes role's tensor merges its amax (DeviceRecipe::amax_target).
  float* amax_target(fp8::Role role, Pass pass) const { return recipe_ ? recipe_->amax_target(role, pass) : nullptr; }

  // out [M, N] = a · op(w) (+ bias) (+ addend, [M, N]), rounded to T: a [M, K] read along its columns (from its row
  // first_row: codes with one scale per tensor), the weight w [K, N] (or [N, K] transposed). `forward`: a forward
  // product (fp8's faster accumulation, where asked for).
  void product(const DeviceOperand<T>& a, const DeviceOperand<T>& w, Transpose tw, std::int64_t M, std::int64_t N,
               std::int64_t K, void* out, const void* bias, const void* addend, bool forward,
               std::int64_t first_row = 0) const {
    if (!a.quantized()) {
      check(first_row == 0, "product", "values are multiplied from their first row, not row ", first_row);
      values_product(a.values, false, w.values, tw == Transpose::yes, M, N, K, bias, addend, out);
      return;
    }
    recipe_->product(a.codes, Fp8Layout::codes, w.codes, tw == Transpose::no ? Fp8Layout::transposed : Fp8Layout::codes,
                     M, N, K, dtype_v<T>, out, bias, addend, forward, first_row);
  }

  // z [M, N] = h · w + bias rounded to T and a's codes [M, N] = fp8(gelu(z's sum)) at `a`'s scale, in one product
  // (DeviceRecipe::gelu_product): h's codes, the weight w [K, N] read as product() reads it untransposed.
  void gelu_product(const DeviceOperand<T>& h, const DeviceOperand<T>& w, std::int64_t M, std::int64_t N,
                    std::int64_t K, void* z, const void* bias, const Fp8Target& a) const {
    recipe_->gelu_product(h.codes, w.codes, M, N, K, dtype_v<T>, bias, z, a);
  }

  // A weight's gradient aᵀ · b as P [shape] from a [M, K1] and b [M, K2] read along their rows (values, or codes
  // whose inner size is M padded with zeros): summed in f32 into [K1, K2] (of `padded_shape`), then cropped (onto
  // `crops` where given).
  template <class P>
  Tensor<P> weight_gradient(const DeviceOperand<T>& a, const DeviceOperand<T>& b, const Shape& shape,
                            const Shape& padded_shape, Resizes<T>* crops) const {
    ParamGrad<P, T> out(shape, padded_shape, a.quantized() ? recipe_->device() : a.values.device());
    constexpr bool wide = ParamGrad<P, T>::wide;
    if (!a.quantized()) {
      const std::int64_t M = a.values.dim(0), k1 = a.values.dim(1), k2 = b.values.dim(1);
      values_product(a.values, true, b.values, false, k1, k2, M, nullptr, nullptr, out.data(), wide);
    } else {
      recipe_->product(a.codes, Fp8Layout::transposed, b.codes, Fp8Layout::transposed, a.codes.cols, b.codes.cols,
                       a.codes.transposed_ld, wide ? dtype_v<compute_t<T>> : dtype_v<T>, out.data(), nullptr, nullptr,
                       false);
    }
    return out.result(crops);
  }

 private:
  std::shared_ptr<const DeviceRecipe> recipe_;
};

// Whether an op's fp8 step on a GPU quantizes: always under cuda::Fp8Dispatch::always, else where fp8::pays_on_gpu
// predicts that it saves time (the callers leave out tensor parallelism, whose ranks must all quantize or none).
bool quantizes_on_gpu(const Fp8Quantization& q, const fp8::StepWork& work);

}  // namespace tapegrad::detail

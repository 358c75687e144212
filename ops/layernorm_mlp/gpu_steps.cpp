// layernorm_mlp's operations on the GPU, which the stages (detail/stages.hpp) run, and where the CPU's take other
// launchers: the norm (cuda::norm_forward, and cuda::norm_backward with db2 = Σ_rows dy in the same pass, its
// `other` rows), the products (cuBLASLt, GELU in GEMM1's epilogue where detail/gpu_steps.hpp says), the activation
// and its backward with db1 in one kernel (cuda/mlp_activation.hpp; with delayed scaling writing a's and dz's fp8
// codes itself). The weight gradients accumulate in f32 on the tensor cores; every parameter gradient is summed in
// C = compute_t<T> and rounded once to its dtype P (ParamGrad).
#include "tapegrad/ops/layernorm_mlp/detail/gpu_steps.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/cuda/mlp_activation.hpp"
#include "tapegrad/cuda/partial_sums.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/activation_table.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/stages.hpp"
#include "tapegrad/tensor/detail/accumulate.hpp"
#include "tapegrad/tensor/factories.hpp"
#include "tapegrad/tensor/gpu/detail/side_stream.hpp"
#include "tapegrad/tensor/gpu/memory.hpp"
#include "tapegrad/tensor/storage.hpp"

namespace tapegrad::detail::mlp {

namespace {

template <class T> const void* data_or_null(const Tensor<T>& t) { return t.defined() ? t.data() : nullptr; }
void* bytes_of(const std::shared_ptr<Storage>& s) { return s ? s->data() : nullptr; }
void* bytes_after(void* x, std::int64_t bytes) { return x ? static_cast<std::uint8_t*>(x) + bytes : nullptr; }

// Weight w (W1's or W2's values) as the products of a node of `dims` read it (the quantizer's weight(): rounded to T,
// its padding queued on `pads`, or quantized, in the layouts asked for).
template <class T, class P>
DeviceOperand<T> weight_operand(const DeviceQuantizer<T>& quantizer, const Dims& dims, const Dims& padded, Weight w,
                                const Tensor<P>& values, Resizes<T>& pads,
                                Layouts layouts = {.columns = true, .rows = true}, Pass pass = Pass::first) {
  const auto [M, H, F, n] = dims;
  const auto [Mp, Hp, Fp, np] = padded;
  if (w == Weight::w2) {
    return quantizer.weight(fp8::Role::kernel2, values, Shape{F, H}, Shape{Fp, Hp}, pads, layouts, pass);
  }
  return quantizer.weight(fp8::Role::kernel1, values, Shape{H, n, F}, Shape{Hp, n, Fp}, pads, layouts, pass);
}

template <class T, class P> class GpuSteps {
 public:
  using Value = T;
  using C = compute_t<T>;
  using Operand = DeviceOperand<T>;
  using Grad = Tensor<P>;
  using ActivationBackward = ActivationGradients<Operand, Grad>;
  using First = FirstProduct<T, Operand>;
  using NormBackward = NormGradients<T, Grad>;

  explicit GpuSteps(GpuSaved<T>& s)
      : s_(s), sharding_(s.options.tensor_parallel), device_(s.x.device()), form_(activation_form(s.options)) {}
  // The forward's, which quantizes W2 from `params` where its product first reads it (fp8; second_product).
  GpuSteps(GpuSaved<T>& s, const Params<P>& params) : GpuSteps(s) { params_ = &params; }

  const Sharding& sharding() const { return sharding_; }
  const LayerNormMLPOptions& options() const { return s_.options; }

  // With TAPEGRAD_MEMORY_TRACE set: the device pool's memory in use and its peak as `stage` is queued, on stderr (the
  // pool counts what is allocated in stream order, so these are the step's own figures at that point).
  void trace(std::string_view stage, std::string_view role = {}) const {
    static const bool enabled = std::getenv("TAPEGRAD_MEMORY_TRACE") != nullptr;
    if (!enabled) return;
    const cuda::MemoryStats m = cuda::memory_stats(device_.index);
    constexpr double mib = 1 << 20;
    std::fprintf(stderr, "layernorm_mlp %-28s in use %9.1f MiB, peak %9.1f MiB\n",
                 (std::string(stage) + (role.empty() ? "" : " ") + std::string(role)).c_str(),
                 static_cast<double>(m.in_use) / mib, static_cast<double>(m.peak_in_use) / mib);
  }

  // h [rows, H] (padded) from x and the saved γ, β: the forward computes the statistics (and h's amax where the
  // recipe takes it from here: the rows are all of h's), a recompute leaves them as they are (bitwise the forward's h).
  Tensor<T> norm(Statistics statistics) const {
    trace("norm");
    const bool compute = statistics == Statistics::compute;
    float* amax = compute && !sharding_.sequence() ? s_.quantizer.amax_target(fp8::Role::input, Pass::first) : nullptr;
    Tensor<T> h(Shape{s_.norm.rows, s_.padded.hidden}, device_);
    cuda::norm_forward(s_.norm,
                       {.x = s_.x.data(),
                        .gamma = s_.gamma.data(),
                        .beta = data_or_null(s_.beta),
                        .y = h.data(),
                        .mean = compute && s_.norm.centered ? s_.mean.data() : nullptr,
                        .rstd = compute ? s_.rstd.data() : nullptr,
                        .epsilon = s_.options.epsilon,
                        .amax = amax},
                       device_.index);
    return h;
  }

  // Role's operand. dz's codes, of a gated activation, go over dz's own values where the recipe can, their transpose
  // made from them once dh's product has read them (weight_gradient_layout): dz (twice a's size) beside both layouts
  // would be the step's peak, above bf16's.
  Operand input(fp8::Role role, Operand x, Layouts layouts, Pass pass) const {
    trace("input", fp8::role_name(role));
    if (role == fp8::Role::grad_hidden && layouts.columns && layouts.rows && form_.width() == 2) {
      return s_.quantizer.input_over(role, std::move(x), pass);
    }
    return s_.quantizer.input(role, std::move(x), layouts, pass);
  }

  // z (padded, [M, nF]) = h · W1 + b1 rounded to T, and, with the GELU epilogue, a = gelu of the unrounded sum: its
  // values, or with fp8 its codes where the recipe knows a's scale before (a forward's first product).
  First first_product(const Operand& h) const {
    trace("GEMM1");
    const auto [M, H, F, n] = s_.padded;
    check(!s_.w1.quantized() || s_.w1.codes.transposed, "layernorm_mlp",
          "an fp8 node on a GPU makes z again only with recompute_all, whose forward keeps W1's transposed codes: run "
          "the forward again rather than a second backward under retain_graph");
    First out{Tensor<T>(Shape{M, n * F}, device_), {}};
    if (gelu_epilogue(h) && !h.quantized()) {
      out.a = Tensor<T>(Shape{M, F}, device_);
      values_product(h.values, false, s_.w1.values, false, M, F, H, s_.b1.data(), nullptr, out.a.values.data(), false,
                     out.z.data());
      return out;
    }
    if (const auto a = gelu_epilogue(h) ? gelu_codes_target(M, F) : std::nullopt) {
      s_.quantizer.gelu_product(h, s_.w1, M, F, H, out.z.data(), s_.b1.data(), *a);
      out.a = a->codes;
    } else {
      s_.quantizer.product(h, s_.w1, Transpose::no, M, n * F, H, out.z.data(), data_or_null(s_.b1), nullptr, true);
    }
    if (s_.options.recompute != Recompute::recompute_all) s_.w1.give_up_transpose();  // (read here alone)
    return out;
  }

  // a (padded, [M, F]): the epilogue's, or the activation kernel's, which writes a's codes itself where the recipe
  // lets it (delayed scaling's known scale, block scaling's tiles along the rows) and the codes are the one layout
  // asked for.
  Operand activation(const First& first, Layouts layouts, Pass pass) const {
    const auto [M, H, F, n] = s_.padded;
    if (first.a.defined()) return input(fp8::Role::activation, first.a, layouts, pass);
    if (!layouts.rows) {
      if (const auto target = s_.quantizer.target(fp8::Role::activation, M, F, layouts, pass)) {
        const auto& scales = target->codes.scales;
        const cuda::ActivationCodes codes{target->codes.codes->data(), target->scale,
                                          scales ? static_cast<float*>(scales->data()) : nullptr};
        cuda::mlp_activation_forward(dtype_v<T>, device_.index, form_, first.z.data(), nullptr, M, F, &codes,
                                     target->amax);
        return target->codes;
      }
    }
    Tensor<T> a(Shape{M, F}, device_);
    cuda::mlp_activation_forward(dtype_v<T>, device_.index, form_, first.z.data(), a.data(), M, F, nullptr,
                                 s_.quantizer.amax_target(fp8::Role::activation, pass));
    return input(fp8::Role::activation, {a}, layouts, pass);
  }

  // y (padded, [M, H]) = a · W2 + b2 (+ x, with_input, in the product's epilogue). With fp8, W2 is quantized here,
  // once a is made (its two layouts are not held beside a's values), and the backward reads its codes, not their
  // transpose.
  Tensor<T> second_product(const Operand& a, bool with_input) const {
    trace("GEMM2");
    const auto [M, H, F, n] = s_.padded;
    if (!s_.w2.defined()) {
      Resizes<T> none;  // (a quantized weight pads nothing)
      s_.w2 = weight_operand(s_.quantizer, s_.dims, s_.padded, Weight::w2, params_->w2, none);
    }
    Tensor<T> y(Shape{M, H}, device_);
    const void* b2 = sharding_.adds_replicated_terms() ? data_or_null(s_.b2) : nullptr;
    s_.quantizer.product(a, s_.w2, Transpose::no, M, H, F, y.data(), b2, with_input ? s_.x.data() : nullptr, true);
    s_.w2.give_up_transpose();
    return y;
  }

  void keep_h(Operand h) { s_.h = std::move(h); }
  void keep_z(const Tensor<T>& z) { s_.z = z; }
  // The saved h and z, given up: their memory goes as soon as the backward is done with them (z's becomes dz's).
  Operand kept_h() const { return std::exchange(s_.h, {}); }
  Tensor<T> kept_z() const { return std::exchange(s_.z, {}); }

  Tensor<T> padded(const Tensor<T>& t) const { return resized(t, Shape{t.dim(0), s_.padded.hidden}); }
  // db2 in the norm's backward pass, which reads dy beside dh: unless the node is sharded (dh then has this rank's
  // rows, or is summed over the ranks after dy was read).
  bool sums_db2_with_norm() const { return !sharding_.sharded(); }
  Grad column_sums(const Tensor<T>& dy) const {
    return detail::column_sums<P>(dy, s_.dims.hidden, Shape{s_.dims.hidden});
  }

  // dh = dz · W1ᵀ [M, H] (+ the addend), padded. W1's codes go with it.
  Tensor<T> norm_output_gradient(const Operand& dz, const Tensor<T>* addend = nullptr) const {
    trace("dh product");
    const auto [M, H, F, n] = s_.padded;
    Tensor<T> dh(Shape{M, H}, device_), added;
    if (addend) added = resized(addend->reshape(Shape{M, s_.dims.hidden}), Shape{M, H});
    const Operand w1 = s_.w1_codes && !s_.w1.codes.codes ? s_.w1_codes() : s_.w1;
    s_.quantizer.product(dz, w1, Transpose::yes, M, H, n * F, dh.data(), nullptr, data_or_null(added), false);
    give_up_codes(s_.w1);
    return dh;
  }

  // From z and dy: da = dy · W2ᵀ [M, F] (dy then keeps the layout dW2 reads, W2's codes go), then, from z and da,
  // dz = da · ∂a/∂z written over z, a = act(z) over da (for dW2), and db1 from the kernel's partial rows. Where the
  // recipe knows a scale before the kernel, the kernel writes those codes instead: dz's and their transpose (delayed
  // scaling, an ungated activation, da taken whole), a's transpose (delayed and current scaling: a's scale is the
  // forward's), and then dz's amax beside dz (current scaling); z goes, and da is made and read in parts of rows
  // where it is large (codes_parts).
  ActivationBackward activation_backward(Tensor<T> z, Operand& dy, Layouts a_layouts, Layouts dz_layouts,
                                         bool need_db1) {
    const auto [M, H, F, n] = s_.padded;
    trace("activation backward");
    // dz's codes in both layouts beside z outgrow bf16's step where dz is large: a gated activation's dz (twice a's
    // size), every dz of a step that takes da in parts (codes_parts) and every z at least W1's size. There dz is
    // written over z and quantized after dW2's product, as current scaling's is (see input()): measured on an H100,
    // delayed scaling's peak at (8192, 4096, 16384) 737 MiB against 993 with the codes (bf16: 768), its step 3 %
    // longer; at (4096, 1024, 4096) (da in four parts, dz's codes packed into z) 85 MiB against 128.5 with da whole and
    // the codes beside z (bf16: 88), its step 8-10 % longer.
    const auto parts = codes_parts(M, F, H);
    const bool whole = parts.size() == 1;
    const bool dz_over_z = n == 2 || !whole || M >= H;
    // A whole da is made first: dy's read layout and W2's codes go before the kernel's codes are allocated (measured on
    // an H100 at (4096, 1024, 4096): current scaling's peak 96.5 MiB against 104.5, delayed 128.5 against 136.5)
    Tensor<T> da = whole ? da_rows(dy, 0, M, true) : Tensor<T>{};
    const auto dz_target =
        dz_over_z ? std::nullopt : s_.quantizer.target(fp8::Role::grad_hidden, M, n * F, dz_layouts, Pass::first);
    // Over z, where dz's scale is one known before the kernel (delayed scaling's) and da is taken in parts, the kernel
    // writes dz's codes along its columns there itself, packed (one byte an element) into z's rows that earlier parts
    // have read: their transpose is made from them after dh's product, and no pass quantizes dz.
    std::optional<Fp8Target> dz_in_z;
    if (dz_over_z && !whole) {
      dz_in_z = s_.quantizer.target(fp8::Role::grad_hidden, M, n * F, {}, Pass::first);
      if (dz_in_z && dz_in_z->codes.scaling != cuda::Fp8Scaling::tensor) dz_in_z.reset();
    }
    std::optional<Fp8Target> a_target;
    if (a_layouts.rows || dz_target) a_target = s_.quantizer.target(fp8::Role::activation, M, F, a_layouts, Pass::later);
    // (current scaling: whether or not a's codes are asked for, so that db1's sums are the same either way)
    float* const dz_amax =
        dz_target || dz_in_z ? nullptr : s_.quantizer.amax_target(fp8::Role::grad_hidden, Pass::first);
    const bool codes = dz_target || dz_in_z || a_target || dz_amax;
    std::optional<ParamGrad<P, T>> db1;
    if (need_db1) db1.emplace(Shape{n, s_.dims.ffn}, Shape{n, F}, device_);
    ActivationBackward out;
    if (codes) {
      cuda::ActivationBackwardCodes args{.wide_dbias = ParamGrad<P, T>::wide};
      if (dz_target) {
        const Fp8Codes& dz_codes = dz_target->codes;
        args.dz_format = dz_codes.format;
        args.dz_scale = dz_target->scale;
        args.dz_codes = bytes_of(dz_codes.codes);
        args.dz_transposed = bytes_of(dz_codes.transposed);
        args.dz_amax = dz_target->amax;
        args.transposed_ld = dz_codes.transposed_ld;
        out.dz = dz_codes;
      } else if (dz_in_z) {
        args.dz_format = dz_in_z->codes.format;
        args.dz_scale = dz_in_z->scale;
        args.dz_codes = z.data();
        args.dz_amax = dz_in_z->amax;
        Fp8Codes dz_codes = dz_in_z->codes;
        dz_codes.codes = z.storage();
        dz_codes.transpose_later = true;
        out.dz = dz_codes;
      } else {
        args.dz = z.data();
        args.dz_amax = dz_amax;
        out.dz = {z};
      }
      if (a_target) {
        args.a_scale = a_target->scale;
        args.a_transposed = bytes_of(a_target->codes.transposed);
        args.transposed_ld = a_target->codes.transposed_ld;
        out.a = a_target->codes;
      }
      backward_codes_in_parts(parts, z, dy, std::move(da), args, dz_in_z.has_value(), db1 ? db1->data() : nullptr);
    } else {
      if (!da.defined()) da = da_rows(dy, 0, M, true);
      Tensor<C> partials(Shape{db1 ? cuda::mlp_activation_partials(M, F, static_cast<int>(n)) : 0}, device_);
      cuda::mlp_activation_backward(dtype_v<T>, device_.index, form_, z.data(), da.data(),
                                    {.dz = z.data(),
                                     .a = a_layouts.rows ? da.data() : nullptr,
                                     .dbias = db1 ? db1->data() : nullptr,
                                     .partials = db1 ? partials.data() : nullptr,
                                     .wide_dbias = ParamGrad<P, T>::wide},
                                    M, F);
      if (a_layouts.rows) out.a = {std::move(da)};
      out.dz = {std::move(z)};
    }
    if (db1) out.db1 = db1->result(&crops_);
    return out;  // (the partials go here: summed into db1, and released before dW2's product)
  }

  Grad weight_gradient(const Operand& a, const Operand& b, Weight w) {
    trace(w == Weight::w2 ? "dW2 product" : "dW1 product");
    const auto [M, H, F, n] = s_.dims;
    const auto [Mp, Hp, Fp, np] = s_.padded;
    if (w == Weight::w2) return s_.quantizer.template weight_gradient<P>(a, b, Shape{F, H}, Shape{Fp, Hp}, &crops_);
    return s_.quantizer.template weight_gradient<P>(a, b, Shape{H, n, F}, Shape{Hp, n, Fp}, &crops_);
  }

  // The ranks' partial dh summed on a side stream while `work` (dW1's product) runs on this one, which then waits.
  template <class Work> Tensor<T> summed_beside(const Tensor<T>& partial, Work&& work) {
    const cuda::SideStream side(device_.index);
    side.wait_for_current();
    Tensor<T> dh;
    {
      const cuda::StreamGuard on_side(side.stream(), device_.index);
      dh = sharding_.summed(partial);
    }
    std::forward<Work>(work)();
    side.current_waits();
    dh_on_side_ = true;
    return dh;
  }
  // y (this rank's rows, padded) += x.
  void add_input(Tensor<T>& y) const { add_to(y, s_.x); }
  void add_rows(Tensor<T>& dh, const Tensor<T>& dh_out) const {
    add_to(dh, resized(dh_out.reshape(Shape{s_.norm.rows, s_.dims.hidden}), Shape{s_.norm.rows, s_.padded.hidden}));
  }

  // dx (padded like x, then cropped) rounds to T once; dγ, dβ and db2 (from dy's rows, where given) are summed in C
  // and rounded once to P.
  NormBackward norm_backward(const Tensor<T>& dh, const Needs& need, const Tensor<T>* db2_rows,
                             const Tensor<T>* dx_addend) {
    trace("norm backward");
    const std::int64_t rows = s_.norm.rows, H = s_.dims.hidden;
    Tensor<T> dx;
    if (need.x) dx = Tensor<T>(Shape{rows, s_.padded.hidden}, device_);
    std::optional<ParamGrad<P, T>> dgamma, dbeta, db2;
    if (need.gamma) dgamma.emplace(Shape{H}, Shape{H}, device_);
    if (need.beta) dbeta.emplace(Shape{H}, Shape{H}, device_);
    if (db2_rows) db2.emplace(Shape{H}, Shape{H}, device_);
    cuda::NormBackwardArgs args{.x = s_.x.data(),
                                .gamma = s_.gamma.data(),
                                .dy = dh.data(),
                                .mean = s_.norm.centered ? s_.mean.data() : nullptr,
                                .rstd = s_.rstd.data(),
                                .dx = need.x ? dx.data() : nullptr,
                                .dgamma = dgamma ? dgamma->data() : nullptr,
                                .dbeta = dbeta ? dbeta->data() : nullptr,
                                .other = db2_rows ? db2_rows->data() : nullptr,
                                .other_sums = db2 ? db2->data() : nullptr,
                                .dx_addend = dx_addend ? dx_addend->data() : nullptr,
                                .wide_parameter_grads = ParamGrad<P, T>::wide};
    Tensor<C> partials(Shape{cuda::norm_backward_partials(s_.norm, args)}, device_);
    args.partials = partials.data();
    cuda::norm_backward(s_.norm, args, device_.index);
    NormBackward out;
    if (need.x) out.dx = crops_.add(dx, Shape{rows, H});
    if (dgamma) out.dgamma = dgamma->result();
    if (dbeta) out.dbeta = dbeta->result();
    if (db2) out.db2 = db2->result();
    return out;
  }

  // Queues the crops of the gradients that came out padded, in one launch; the side stream that made a sharded dh
  // waits for its readers.
  void finish() {
    crops_.run();
    if (dh_on_side_) cuda::SideStream(device_.index).wait_for_current();
  }

 private:
  // Whether GEMM1 applies the activation in cuBLASLt's epilogue (GELU_AUX_BIAS): GELU with a bias, in a type it has
  // the epilogue for, on rows the epilogue can write (ffn a multiple of 8 elements); with fp8, for a 16-bit z
  // (cuBLASLt's FP8 kernels misread an f32 bias) where the epilogue can write a's codes (gelu_codes_target).
  bool gelu_epilogue(const Operand& h) const {
    return s_.options.activation == Activation::gelu && s_.b1.defined() && !std::is_same_v<T, double> &&
           s_.padded.ffn % 8 == 0 && (!h.quantized() || !std::is_same_v<T, float>);
  }
  // Where the forward's GEMM1 writes a's codes [M, F] itself: delayed scaling's, whose one scale per tensor is known
  // before the product, in the one layout GEMM2 reads. Not in a backward, whose z made again needs no a.
  std::optional<Fp8Target> gelu_codes_target(std::int64_t M, std::int64_t F) const {
    if (!params_ || !std::holds_alternative<fp8::DelayedScaling>(s_.options.fp8->recipe)) return std::nullopt;
    return s_.quantizer.target(fp8::Role::activation, M, F, {.columns = true}, Pass::first);
  }

  // da = dy · W2ᵀ [rows, F] from dy's row `first`; after the last rows' product dy keeps the layout dW2 reads, and
  // W2's codes go.
  Tensor<T> da_rows(Operand& dy, std::int64_t first, std::int64_t rows, bool last) const {
    const auto [M, H, F, n] = s_.padded;
    Tensor<T> da(Shape{rows, F}, device_);
    s_.quantizer.product(dy, s_.w2, Transpose::yes, rows, F, H, da.data(), nullptr, nullptr, false, first);
    if (last) {
      dy = dy.weight_gradient_layout();
      give_up_codes(s_.w2);
    }
    return da;
  }

  // The fused backward with args' outputs (and db1 into dbias, unless null), over the parts' rows (codes_parts): each
  // part's da made just before its kernel (the whole da given where there is one part), which starts at the part's
  // row of z, dz and dz's codes and at its column of the transposes; the parts' partial rows of db1 side by side,
  // summed after the last. dy then keeps the layout dW2 reads, and W2's codes go. `codes_in_z`: dz's codes go into z
  // itself (args.dz_codes is z), each part's at its rows of the packed codes, which lie in z's rows that earlier parts
  // have read (a part no larger than those before it, in 16-bit or wider values: its codes end by byte 2·first·n·F);
  // the first part's aside, copied there once its kernel has read its rows.
  void backward_codes_in_parts(const std::vector<std::pair<std::int64_t, std::int64_t>>& parts, const Tensor<T>& z,
                               Operand& dy, Tensor<T> whole_da, const cuda::ActivationBackwardCodes& args,
                               bool codes_in_z, void* dbias) const {
    const auto [M, H, F, n] = s_.padded;
    const int width = static_cast<int>(n);
    std::int64_t partials_size = 0;
    for (const auto& [first, rows] : parts) partials_size += cuda::mlp_activation_codes_partials(rows, F, width);
    Tensor<C> partials(Shape{dbias ? partials_size : 0}, device_);
    std::int64_t partials_at = 0;
    for (std::size_t p = 0; p < parts.size(); ++p) {
      const auto [first, rows] = parts[p];
      const Tensor<T> da = whole_da.defined() ? std::move(whole_da) : da_rows(dy, first, rows, p + 1 == parts.size());
      cuda::ActivationBackwardCodes part = args;
      part.dz = bytes_after(args.dz, first * n * F * static_cast<std::int64_t>(sizeof(T)));
      part.dz_codes = bytes_after(args.dz_codes, first * n * F);
      std::shared_ptr<Storage> aside;
      if (codes_in_z && p == 0) {
        aside = Storage::allocate(static_cast<std::size_t>(rows * n * F), device_);
        part.dz_codes = aside->data();
      }
      check(!codes_in_z || p == 0 || first + rows <= first * static_cast<std::int64_t>(sizeof(T)), "layernorm_mlp",
            "internal: dz's codes of rows ", first, " .. ", first + rows, " would overlap the z they are made from");
      part.dz_transposed = bytes_after(args.dz_transposed, first);
      part.a_transposed = bytes_after(args.a_transposed, first);
      part.partials = dbias ? partials.data() + partials_at : nullptr;
      trace("activation backward, da's part");
      cuda::mlp_activation_backward_codes(dtype_v<T>, device_.index, form_, z.data() + first * n * F, da.data(), part,
                                          rows, F);
      if (aside) copy_bytes(args.dz_codes, device_, aside->data(), device_, aside->bytes());
      partials_at += cuda::mlp_activation_codes_partials(rows, F, width);
    }
    if (dbias) {
      const cuda::PartialSums sums{partials.data(), dbias};
      cuda::sum_partials(ParamGrad<P, T>::wide ? dtype_v<C> : dtype_v<T>, {&sums, 1}, partials_size / (n * F), n * F,
                         device_.index);
    }
  }

  // The parts of rows [first, first + rows) in which the fused backward takes da [M, F] = dy · W2ᵀ, each part's rows
  // whole tiles of 64 of the kernel but the last's (so that each starts on a 16-byte column of the transposes). A part
  // of da is held beside z, a's transposed codes and what every part's product reads (dy's codes along its columns and
  // W2's codes), and with delayed scaling the first part's dz codes: 4 bytes an element of z (dz written over z) and
  // those codes in quarters, under bf16's z and da (4 bytes). So: four parts where each half's product would have
  // at least 2^36 multiply-adds (the large blocks) or z is at least twice W1's size (M ≥ 2H: the activations, not the
  // weights, make the step's peak), else one. Smaller products cost more: measured on an H100 by ncu, at (4096, 1024,
  // 4096) da's four products 52.6 µs against 34.3 for one and the kernel's four launches 62.6 against 54.9; at (8192,
  // 4096, 16384) four products 770 µs against 764 for two halves.
  static std::vector<std::pair<std::int64_t, std::int64_t>> codes_parts(std::int64_t M, std::int64_t F,
                                                                        std::int64_t H) {
    constexpr std::int64_t tile = 64;
    const std::int64_t half = (M / 2 + tile - 1) / tile * tile;
    const std::int64_t count = M >= 2 * tile && (half * F * H >= (std::int64_t{1} << 36) || M >= 2 * H) ? 4 : 1;
    const std::int64_t rows = (M / count + tile - 1) / tile * tile;
    std::vector<std::pair<std::int64_t, std::int64_t>> parts;
    for (std::int64_t first = 0; first < M; first += rows) parts.emplace_back(first, std::min(rows, M - first));
    return parts;
  }

  // A saved weight's codes, given up by the backward after their last product. Only recompute_all's backward can run
  // again (retain_graph) and read them; the other policies' second fp8 backward has no z and refuses to make it again
  // (first_product's check) before it would read a weight. Values (no fp8) stay: a second backward reads them.
  void give_up_codes(Operand& w) const {
    if (w.quantized() && s_.options.recompute != Recompute::recompute_all) w = {};
  }

  GpuSaved<T>& s_;
  const Params<P>* params_ = nullptr;  // the forward's
  Sharding sharding_;
  Device device_;
  ActivationForm form_;
  Resizes<T> crops_;  // the backward's gradients that come out padded, cropped together by finish()
  bool dh_on_side_ = false;
};

}  // namespace

template <class T, class P>
Forward<T> gpu_forward(GpuSaved<T>& s, const Dims& dims, const LayerNormMLPOptions& options, const Tensor<T>& x,
                       const Params<P>& params) {
  using C = compute_t<T>;
  const auto [M, H, F, n] = dims;
  const Device device = x.device();
  s.options = options;
  // Where fp8 would not pay; not under tensor parallelism, whose ranks must all quantize or none (their shards of F
  // may differ in size).
  if (options.fp8 && !options.tensor_parallel &&
      !quantizes_on_gpu(*options.fp8, fp8::StepWork::layernorm_mlp(M, H, F, activation_form(options).width()))) {
    s.options.fp8.reset();
  }
  const bool quantized = s.options.fp8.has_value();
  s.dims = dims;
  // (delayed: ends the state's last step)
  s.quantizer =
      DeviceQuantizer<T>("layernorm_mlp", s.options.fp8, device, Sharding(options.tensor_parallel).amax_group());
  s.padded = {M, s.quantizer.padded(H), s.quantizer.padded(F), n};
  const std::int64_t Hp = s.padded.hidden, Fp = s.padded.ffn;
  const std::int64_t rows = M / Sharding(options.tensor_parallel).row_factor();  // this rank's rows of x
  s.norm = {.dtype = dtype_v<T>,
            .rows = rows,
            .hidden = H,
            .ld = Hp,
            .centered = options.norm == NormType::layernorm,
            .zero_centered_gamma = options.zero_centered_gamma};
  Resizes<T> pads;  // x and the parameters padded in one launch
  s.x = pads.add(x.reshape(Shape{rows, H}), Shape{rows, Hp});
  s.gamma = cast<T>(params.gamma);
  if (params.beta) s.beta = cast<T>(*params.beta);
  if (quantized && !s.quantizer.caches_weights()) {
    s.w1 = weight_operand(s.quantizer, dims, s.padded, Weight::w1, params.w1, pads, {.rows = true});
    s.w1_codes = [quantizer = s.quantizer, dims, padded = s.padded, w1 = params.w1] {
      Resizes<T> none;  // (a quantized weight pads nothing)
      return weight_operand(quantizer, dims, padded, Weight::w1, w1, none, {.columns = true}, Pass::later);
    };
  } else {
    s.w1 = weight_operand(s.quantizer, dims, s.padded, Weight::w1, params.w1, pads);
    s.w1_codes = nullptr;
  }
  // (fp8: second_product's)
  if (!quantized) s.w2 = weight_operand(s.quantizer, dims, s.padded, Weight::w2, params.w2, pads);
  if (params.b1) s.b1 = pads.add(cast<T>(*params.b1).reshape(Shape{n, F}), Shape{n, Fp});
  if (params.b2) s.b2 = pads.add(cast<T>(*params.b2), Shape{Hp});
  pads.run();
  s.mean = Tensor<C>(Shape{s.norm.centered ? rows : 0}, device);
  s.rstd = Tensor<C>(Shape{rows}, device);
  GpuSteps<T, P> steps(s, params);
  const Forward<T> out = forward(steps);
  s.quantizer.end_pass();
  const Tensor<T> h = options.return_layernorm_output ? resized(out.h, Shape{rows, H}) : Tensor<T>();
  return {resized(out.y, Shape{rows, H}), h};
}

template <class T, class P>
Gradients<T, Tensor<P>> gpu_backward(GpuSaved<T>& s, const Tensor<T>& dy, const Tensor<T>* dh_out, const Needs& need) {
  GpuSteps<T, P> steps(s);
  Gradients<T, Tensor<P>> g = backward(steps, dy.reshape(Shape{s.norm.rows, s.dims.hidden}), dh_out, need);
  s.quantizer.end_pass();
  steps.finish();
  return g;
}

#define TAPEGRAD_INSTANTIATE_GPU_MLP_PARAMS(T, P)                                                               \
  template Forward<T> gpu_forward<T, P>(GpuSaved<T>&, const Dims&, const LayerNormMLPOptions&, const Tensor<T>&, \
                                        const Params<P>&);                                                      \
  template Gradients<T, Tensor<P>> gpu_backward<T, P>(GpuSaved<T>&, const Tensor<T>&, const Tensor<T>*, const Needs&);
#define TAPEGRAD_INSTANTIATE_GPU_MLP(T)                    \
  TAPEGRAD_INSTANTIATE_GPU_MLP_PARAMS(T, float)            \
  TAPEGRAD_INSTANTIATE_GPU_MLP_PARAMS(T, double)           \
  TAPEGRAD_INSTANTIATE_GPU_MLP_PARAMS(T, ::tapegrad::bf16) \
  TAPEGRAD_INSTANTIATE_GPU_MLP_PARAMS(T, ::tapegrad::f16)
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_GPU_MLP)

}  // namespace tapegrad::detail::mlp

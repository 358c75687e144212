// layernorm_mlp's operations on the CPU, which the stages (detail/stages.hpp) run: the norm's row kernels
// (ops/detail/norm_rows.hpp), the products of operands (ops/fp8/detail/products.hpp) and the activation's row kernels
// (detail/cpu_activation.hpp), over M rows with W1 viewed as [H, n·F] and z as [M, n·F].
#include "tapegrad/ops/layernorm_mlp/detail/cpu_steps.hpp"

#include <type_traits>
#include <utility>
#include <vector>

#include "tapegrad/ops/fp8/detail/products.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/activation_table.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/cpu_activation.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/stages.hpp"
#include "tapegrad/tensor/detail/accumulate.hpp"

namespace tapegrad::detail::mlp {

namespace {

template <class T> auto row_of(const T* values, std::int64_t n) {
  return Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(values, n);
}
// values [n] widened to C into `buffer`, which keeps its allocation from row to row.
template <class C, class T> const Row<C>& widen_into(Row<C>& buffer, const T* values, std::int64_t n) {
  buffer = row_of(values, n).template cast<C>();
  return buffer;
}
template <class T, class C> void store_row(const Row<C>& values, T* out) {
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(out, values.size()) = values.template cast<T>();
}
template <class Gate> constexpr bool is_gated_v = !std::is_same_v<std::decay_t<Gate>, NoGate>;

template <class T> class CpuSteps {
 public:
  using Value = T;
  using C = compute_t<T>;
  using Operand = detail::Operand<T>;
  using Grad = Tensor<C>;
  using ActivationBackward = ActivationGradients<Operand, Grad>;
  using NormBackward = NormGradients<T, Grad>;

  // `s` is written by the forward only: the backward reads it (a second backward under retain_graph reads it again).
  explicit CpuSteps(CpuSaved<T>& s) : s_(s), sharding_(s.options.tensor_parallel) {}

  const Sharding& sharding() const { return sharding_; }
  const LayerNormMLPOptions& options() const { return s_.options; }

  // h [rows, H] of this rank's rows.
  Tensor<T> norm(Statistics statistics) const {
    Tensor<T> h(Shape{s_.norm.rows, s_.dims.hidden});
    if (statistics == Statistics::compute) {
      s_.norm.forward(s_.options.epsilon, h.data());
    } else {
      s_.norm.apply_rows(h.data());
    }
    return h;
  }

  // Input `role`'s operand, its columns the parts of a gated block where it has them (dz).
  Operand input(fp8::Role role, Operand x, Layouts layouts, Pass pass) const {
    const auto [M, H, F, n] = s_.dims;
    switch (role) {
      case fp8::Role::activation: return s_.quantizer.input(role, std::move(x), M, F, layouts, pass);
      case fp8::Role::grad_hidden: return s_.quantizer.input(role, std::move(x), M, n * F, layouts, pass, n);
      default: return s_.quantizer.input(role, std::move(x), M, H, layouts, pass);  // h, dy
    }
  }

  FirstProduct<T> first_product(const Operand& h) const {
    const auto [M, H, F, n] = s_.dims;
    return {product(h, s_.w1, Transpose::no, M, n * F, H, bias_rows(s_.b1)), {}};
  }

  Operand activation(const FirstProduct<T>& first, Layouts layouts, Pass pass) const {
    const auto [M, H, F, n] = s_.dims;
    Tensor<T> a(Shape{M, F});
    with_activation(activation_form(s_.options), [&](const auto& fn, const auto& gate) {
      parallel_for(M, 2 * n * F, [&](std::int64_t begin, std::int64_t end) {
        Row<C> z0(F), z1(F), value(F), gate_value(F);
        for (std::int64_t r = begin; r < end; ++r) {
          const T* zr = first.z.data() + r * n * F;
          fn(widen_into(z0, zr, F), value, nullptr);
          if constexpr (is_gated_v<decltype(gate)>) {
            gate(widen_into(z1, zr + F, F), gate_value, nullptr);
            value *= gate_value;
          }
          store_row(value, a.data() + r * F);
        }
      });
    });
    return input(fp8::Role::activation, {a}, layouts, pass);
  }

  // y = a · W2 (+ b2 where this rank adds it) (+ x, with_input).
  Tensor<T> second_product(const Operand& a, bool with_input) const {
    const auto [M, H, F, n] = s_.dims;
    Addend<T> add = sharding_.adds_replicated_terms() ? bias_rows(s_.b2) : Addend<T>{};
    if (with_input) add.matrix = s_.norm.x.data();
    return product(a, s_.w2, Transpose::no, M, H, F, add);
  }
  // y (this rank's rows) += x.
  void add_input(Tensor<T>& y) const { add_to(y, s_.norm.x.reshape(y.shape())); }

  void keep_h(Operand h) { s_.h = std::move(h); }
  void keep_z(const Tensor<T>& z) { s_.z = z; }
  Operand kept_h() const { return s_.h; }
  Tensor<T> kept_z() const { return s_.z; }
  Tensor<T> padded(const Tensor<T>& t) const { return t; }
  bool sums_db2_with_norm() const { return false; }
  Grad column_sums(const Tensor<T>& dy) const { return detail::column_sums(dy, s_.dims.rows, s_.dims.hidden); }

  // dh = dz · W1ᵀ [M, H] (+ the addend).
  Tensor<T> norm_output_gradient(const Operand& dz, const Tensor<T>* addend = nullptr) const {
    const auto [M, H, F, n] = s_.dims;
    return product(dz, s_.w1, Transpose::yes, M, H, n * F, {.matrix = addend ? addend->data() : nullptr});
  }

  // From z and dy: da = dy · W2ᵀ [M, F] (dy then keeps the layout dW2 reads), and from z and da a = act(z) [M, F] and
  // dz = da · ∂a/∂z [M, nF] in one pass, and db1 = Σ_rows dz where asked for.
  ActivationBackward activation_backward(Tensor<T> z, Operand& dy, Layouts, Layouts, bool need_db1) const {
    const auto [M, H, F, n] = s_.dims;
    const Tensor<T> da = product(dy, s_.w2, Transpose::yes, M, F, H, {});
    dy = dy.weight_gradient_layout();
    Tensor<T> a(Shape{M, F}), dz(Shape{M, n * F});
    const std::vector<C> db1 = with_activation(activation_form(s_.options), [&](const auto& fn, const auto& gate) {
      return blocked_row_sum<C>(M, need_db1 ? n * F : 0, 3 * n * F, [&](std::int64_t begin, std::int64_t end, C* sum) {
        Row<C> z0(F), z1(F), dar(F), value(F), grad(F), gate_value(F), gate_grad(F), dz0(F), dz1(F);
        for (std::int64_t r = begin; r < end; ++r) {
          const T* zr = z.data() + r * n * F;
          widen_into(dar, da.data() + r * F, F);
          fn(widen_into(z0, zr, F), value, &grad);
          if constexpr (is_gated_v<decltype(gate)>) {
            gate(widen_into(z1, zr + F, F), gate_value, &gate_grad);
            dz0 = dar * gate_value * grad;
            dz1 = dar * value * gate_grad;
            value *= gate_value;
            store_row(dz1, dz.data() + r * n * F + F);
            if (need_db1) Eigen::Map<Row<C>>(sum + F, F) += dz1;
          } else {
            dz0 = dar * grad;
          }
          store_row(value, a.data() + r * F);
          store_row(dz0, dz.data() + r * n * F);
          if (need_db1) Eigen::Map<Row<C>>(sum, F) += dz0;
        }
      });
    });
    return {{a}, {dz}, need_db1 ? from_vector(db1, Shape{n * F}) : Grad()};
  }

  Grad weight_gradient(const Operand& a, const Operand& b, Weight w) const {
    const auto [M, H, F, n] = s_.dims;
    return w == Weight::w2 ? detail::weight_gradient(a, b, M, F, H) : detail::weight_gradient(a, b, M, H, n * F);
  }

  template <class Work> Tensor<T> summed_beside(const Tensor<T>& partial, Work&& work) const {
    std::forward<Work>(work)();
    return sharding_.summed(partial);
  }
  void add_rows(Tensor<T>& dh, const Tensor<T>& dh_out) const { add_to(dh, dh_out.reshape(dh.shape())); }

  NormBackward norm_backward(const Tensor<T>& dh, const Needs& need, const Tensor<T>*,
                             const Tensor<T>* dx_addend) const {
    const std::int64_t H = s_.dims.hidden;
    NormGrads<T> grads = detail::norm_backward(s_.norm, dh, need.x, need.gamma, need.beta, dx_addend);
    const auto part = [&](bool wanted, std::int64_t offset) {
      return wanted ? from_vector(std::vector<C>(grads.dgamma_dbeta.begin() + offset,
                                                 grads.dgamma_dbeta.begin() + offset + H),
                                  Shape{H})
                    : Grad();
    };
    return {std::move(grads.dx), part(need.gamma, 0), part(need.beta, H), {}};
  }

 private:
  CpuSaved<T>& s_;
  Sharding sharding_;
};

}  // namespace

template <class T, class P>
Forward<T> cpu_forward(CpuSaved<T>& s, const Dims& dims, const LayerNormMLPOptions& options, const Tensor<T>& x,
                       const Params<P>& params) {
  const auto [M, H, F, n] = dims;
  s.options = options;
  s.dims = dims;
  s.norm = NormRows<T>(options.norm == NormType::layernorm, x, params.gamma, params.beta, options.zero_centered_gamma);
  // (delayed scaling: ends the state's previous step)
  s.quantizer = Quantizer<T>("layernorm_mlp", options.fp8, Sharding(options.tensor_parallel).amax_group());
  s.w1 = s.quantizer.weight(fp8::Role::kernel1, params.w1, H, n * F, n);
  s.w2 = s.quantizer.weight(fp8::Role::kernel2, params.w2, F, H);
  if (params.b1) s.b1 = cast<T>(*params.b1);
  if (params.b2) s.b2 = cast<T>(*params.b2);
  CpuSteps<T> steps(s);
  Forward<T> out = forward(steps);
  s.quantizer.end_pass();
  return out;
}

template <class T>
Gradients<T, Tensor<compute_t<T>>> cpu_backward(CpuSaved<T>& s, const Tensor<T>& dy, const Tensor<T>* dh_out,
                                                const Needs& need) {
  CpuSteps<T> steps(s);
  auto g = backward(steps, dy.reshape(Shape{s.norm.rows, s.dims.hidden}), dh_out, need);
  s.quantizer.end_pass();
  return g;
}

#define TAPEGRAD_INSTANTIATE_CPU_MLP_PARAMS(T, P)                                                               \
  template Forward<T> cpu_forward<T, P>(CpuSaved<T>&, const Dims&, const LayerNormMLPOptions&, const Tensor<T>&, \
                                        const Params<P>&);
#define TAPEGRAD_INSTANTIATE_CPU_MLP(T)                                                                          \
  TAPEGRAD_INSTANTIATE_CPU_MLP_PARAMS(T, float)                                                                  \
  TAPEGRAD_INSTANTIATE_CPU_MLP_PARAMS(T, double)                                                                 \
  TAPEGRAD_INSTANTIATE_CPU_MLP_PARAMS(T, ::tapegrad::bf16)                                                       \
  TAPEGRAD_INSTANTIATE_CPU_MLP_PARAMS(T, ::tapegrad::f16)                                                        \
  template Gradients<T, Tensor<compute_t<T>>> cpu_backward<T>(CpuSaved<T>&, const Tensor<T>&, const Tensor<T>*,      \
                                                              const Needs&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_CPU_MLP)

}  // namespace tapegrad::detail::mlp

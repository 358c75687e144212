// layernorm_mlp: one tape node whose backward computes every gradient directly. This file holds the node and its
// CPU path; for x on a GPU its forward and backward run the same steps in ops/layernorm_mlp_gpu.cpp.
//
// With M rows (x's leading dims flattened), W1 viewed as [H, n·F] and z as [M, n·F]:
//
//   forward                                  backward (dy [M, H])
//   h  = norm(x)          [M, H]   stats    db2 = Σ_rows dy
//   z  = h · W1 + b1      [M, nF]           da  = dy · W2ᵀ                    [M, F]
//   a  = act(z)           [M, F]            a, dz = act(z), da · ∂a/∂z        one pass over z; db1 = Σ_rows dz
//   y  = a · W2 + b2      [M, H]            dW2 = aᵀ · dy,  dW1 = hᵀ · dz
//                                           dh  = dz · W1ᵀ (+ the gradient of the returned h)
//                                           dx, dγ, dβ = norm backward of dh
//
// Each stage rounds to the compute dtype T once, as the composite of primitive ops does; inside a stage (the
// products, the bias adds, the activation and its derivative, every sum over rows) values are in C = compute_t<T>.
// The biases enter the products as their initial C (beta = 1), so the add costs no pass of its own. Parameter
// gradients are accumulated in C and rounded once to the parameter dtype P.
//
// Saved (the context): x (shared with the input), the norm's mean and rstd per row, γ and β in C, W1, W2 and the
// biases rounded to T (the parameters themselves when P = T), and by policy h and z. a is never saved: the
// backward's pass over z produces it next to ∂a/∂z at the cost of one activation evaluation. Recomputed h and z
// come from the same functions with the same statistics, so every policy gives bitwise identical gradients.
//
// With fp8 quantization (ops/fp8_operands.hpp) every product multiplies quantized values, read back in C: the
// context keeps the quantized W1 and W2 (instead of their T copies) and the step's scales, and the products round
// their C results to T as above.
#include "tapegrad/ops/layernorm_mlp.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <tuple>
#include <vector>

#include "tapegrad/autodiff/custom_op.hpp"
#include "tapegrad/ops/activation_table.hpp"
#include "tapegrad/ops/fp8_operands.hpp"
#include "tapegrad/ops/gemm.hpp"
#include "tapegrad/ops/layernorm_mlp_check.hpp"
#include "tapegrad/ops/layernorm_mlp_gpu.hpp"
#include "tapegrad/ops/layernorm_mlp_sharding.hpp"
#include "tapegrad/ops/mlp_activation.hpp"
#include "tapegrad/ops/norm_rows.hpp"
#include "tapegrad/ops/products.hpp"
#include "tapegrad/tensor/accumulate.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"

namespace tapegrad {

namespace {

constexpr const char* op_name = "layernorm_mlp";
using detail::MlpDims;
using detail::MlpNeeds;
using detail::Addend;
using detail::bias_rows;
using detail::column_sums;
using detail::product;
using detail::weight_gradient;

template <class T> struct MlpContext {
  using C = compute_t<T>;
  LayerNormMLPOptions options;
  MlpDims dims{};
  detail::NormRows<T> norm;
  Tensor<T> w1, w2, b1, b2;  // in T; a bias is undefined when absent; with fp8 no w1, w2
  Tensor<T> h, z;            // [M, H] and [M, nF], kept by policy
  std::optional<detail::Fp8Operands<T>> fp8;
  Tensor<C> w1q, w2q;  // with fp8: W1 [H, nF] and W2 [F, H] quantized, as the products read them
  // All of the above, for x on a GPU. Mutable: the GPU backward releases the saved h and z as soon as it is done
  // with them (a second backward under retain_graph recomputes them, bitwise the same).
  mutable detail::DeviceMlp<T> device;
};

// z = h · W1 + b1, rounded to T once; `first`: the forward's (fp8: h's amax counts then).
template <class T> Tensor<T> first_product(const MlpContext<T>& c, const Tensor<T>& h, bool first) {
  const auto [M, H, F, n] = c.dims;
  if (c.fp8) {
    const auto hq = c.fp8->input(fp8::Role::input, h, M, H, detail::Inner::along_columns, first);
    return product(Transpose::no, Transpose::no, M, n * F, H, hq, c.w1q, bias_rows(c.b1));
  }
  return product(Transpose::no, Transpose::no, M, n * F, H, h, c.w1, bias_rows(c.b1));
}

// The norm output h [M, H], recomputed bitwise when the policy did not keep it (and gathered again from the ranks
// under sequence parallelism).
template <class T> Tensor<T> norm_output(const MlpContext<T>& c) {
  if (c.h.defined()) return c.h;
  Tensor<T> h(Shape{c.norm.rows, c.dims.hidden});
  c.norm.apply_rows(h.data());
  return detail::MlpSharding(c.options.tensor_parallel).gathered_rows(h);
}

template <class T> auto row_of(const T* values, std::int64_t n) {
  return Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(values, n);
}
// values [n] widened to C into `buffer`, which keeps its allocation from row to row.
template <class C, class T> const detail::Row<C>& widen_into(detail::Row<C>& buffer, const T* values, std::int64_t n) {
  buffer = row_of(values, n).template cast<C>();
  return buffer;
}
template <class T, class C> void store_row(const detail::Row<C>& values, T* out) {
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(out, values.size()) = values.template cast<T>();
}

// a = act(z) [M, F].
template <class T> Tensor<T> activation_forward(const MlpContext<T>& c, const Tensor<T>& z) {
  using C = compute_t<T>;
  const auto [M, H, F, n] = c.dims;
  Tensor<T> a(Shape{M, F});
  detail::with_activation(detail::activation_form(c.options), [&](const auto& fn, const auto& gate) {
    constexpr bool gated = !std::is_same_v<std::decay_t<decltype(gate)>, detail::NoGate>;
    parallel_for(M, 2 * n * F, [&](std::int64_t begin, std::int64_t end) {
      detail::Row<C> z0(F), z1(F), value(F), gate_value(F);
      for (std::int64_t r = begin; r < end; ++r) {
        const T* zr = z.data() + r * n * F;
        fn(widen_into(z0, zr, F), value, nullptr);
        if constexpr (gated) {
          gate(widen_into(z1, zr + F, F), gate_value, nullptr);
          value *= gate_value;
        }
        store_row(value, a.data() + r * F);
      }
    });
  });
  return a;
}

// From z and da: a = act(z) [M, F] and dz = da · ∂a/∂z [M, nF]; returns db1 = Σ_rows dz in C (empty unless
// asked for).
template <class T>
std::vector<compute_t<T>> activation_backward(const MlpContext<T>& c, const Tensor<T>& z, const Tensor<T>& da,
                                              Tensor<T>& a, Tensor<T>& dz, bool need_db1) {
  using C = compute_t<T>;
  const auto [M, H, F, n] = c.dims;
  return detail::with_activation(detail::activation_form(c.options), [&](const auto& fn, const auto& gate) {
    constexpr bool gated = !std::is_same_v<std::decay_t<decltype(gate)>, detail::NoGate>;
    return detail::blocked_row_sum<C>(
        M, need_db1 ? n * F : 0, 3 * n * F, [&](std::int64_t begin, std::int64_t end, C* db1) {
          detail::Row<C> z0(F), z1(F), dar(F), value(F), grad(F), gate_value(F), gate_grad(F), dz0(F), dz1(F);
          for (std::int64_t r = begin; r < end; ++r) {
            const T* zr = z.data() + r * n * F;
            widen_into(dar, da.data() + r * F, F);
            fn(widen_into(z0, zr, F), value, &grad);
            if constexpr (gated) {
              gate(widen_into(z1, zr + F, F), gate_value, &gate_grad);
              dz0 = dar * gate_value * grad;
              dz1 = dar * value * gate_grad;
              value *= gate_value;
              store_row(dz1, dz.data() + r * n * F + F);
              if (need_db1) Eigen::Map<detail::Row<C>>(db1 + F, F) += dz1;
            } else {
              dz0 = dar * grad;
            }
            store_row(value, a.data() + r * F);
            store_row(dz0, dz.data() + r * n * F);
            if (need_db1) Eigen::Map<detail::Row<C>>(db1, F) += dz0;
          }
        });
  });
}

template <class T> struct MlpForward {
  Tensor<T> y, h;  // [M, H] each
};

template <class T> MlpForward<T> mlp_forward(MlpContext<T>& c) {
  const auto [M, H, F, n] = c.dims;
  const detail::MlpSharding sharding(c.options.tensor_parallel);
  Tensor<T> h_rows(Shape{c.norm.rows, H});  // this rank's (M rows unless sequence parallel)
  c.norm.forward(c.options.epsilon, h_rows.data());
  const Tensor<T> h = sharding.gathered_rows(h_rows);
  Tensor<T> z = first_product(c, h, true);
  const Tensor<T> a = activation_forward(c, z);
  const Addend<T> b2 = sharding.adds_replicated_terms() ? bias_rows(c.b2) : Addend<T>{};
  const Tensor<T> y =
      c.fp8 ? product(Transpose::no, Transpose::no, M, H, F,
                      c.fp8->input(fp8::Role::activation, a, M, F, detail::Inner::along_columns, true), c.w2q, b2)
            : product(Transpose::no, Transpose::no, M, H, F, a, c.w2, b2);
  if (c.options.recompute == Recompute::save_all) c.h = h;
  if (c.options.recompute != Recompute::recompute_all) c.z = z;
  return {sharding.summed(y), h_rows};
}

template <class T> struct MlpGrads {
  using C = compute_t<T>;
  Tensor<T> dx;
  std::vector<C> dgamma_dbeta, db1, db2;
  Tensor<C> dw1, dw2;
};

// dy and, with return_layernorm_output, dh_out [M, H] are the gradients of y and of the returned h.
template <class T>
MlpGrads<T> mlp_backward(const MlpContext<T>& c, const Tensor<T>& dy_rows, const Tensor<T>* dh_out,
                         const MlpNeeds& need) {
  using C = compute_t<T>;
  const auto [M, H, F, n] = c.dims;
  const detail::MlpSharding sharding(c.options.tensor_parallel);
  const Tensor<T> dy = sharding.gathered_rows(dy_rows.reshape(Shape{c.norm.rows, H}));
  MlpGrads<T> g;
  if (need.b2) g.db2 = column_sums(dy, M, H);
  const bool need_dh = need.x || need.gamma || need.beta;
  const bool need_dz = need_dh || need.w1 || need.b1;
  if (!need_dz && !need.w2) return g;

  const Tensor<T> h = norm_output(c);
  const Tensor<T> z = c.z.defined() ? c.z : first_product(c, h, false);
  // fp8: each gradient quantized as the dgrad product reads it (its amax counts then), and the inputs of the weight
  // gradients as those read them, summing over the rows (the same tensors unless block scaling tiles them).
  using Inner = detail::Inner;
  Tensor<C> dy_columns, dz_columns;  // fp8: dy and dz as the dgrad products read them
  Tensor<T> a(Shape{M, F}), dz;
  if (need_dz) {
    if (c.fp8) dy_columns = c.fp8->input(fp8::Role::grad_output, dy, M, H, Inner::along_columns, true);
    const Tensor<T> da = c.fp8 ? product<T>(Transpose::no, Transpose::yes, M, F, H, dy_columns, c.w2q)
                               : product<T>(Transpose::no, Transpose::yes, M, F, H, dy, c.w2);
    dz = Tensor<T>(Shape{M, n * F});
    g.db1 = activation_backward(c, z, da, a, dz, need.b1);
  } else {
    a = activation_forward(c, z);
  }
  if (need.w2) {
    g.dw2 = c.fp8 ? weight_gradient(c.fp8->input(fp8::Role::activation, a, M, F, Inner::along_rows, false),
                                    c.fp8->along_rows(fp8::Role::grad_output, dy, M, H, dy_columns, !need_dz), M, F,
                                    H)
                  : weight_gradient(a, dy, M, F, H);
  }
  if (c.fp8 && need_dh) {
    dz_columns = c.fp8->input(fp8::Role::grad_hidden, dz, M, n * F, Inner::along_columns, true, n);
  }
  if (need.w1) {
    g.dw1 = c.fp8 ? weight_gradient(c.fp8->input(fp8::Role::input, h, M, H, Inner::along_rows, false),
                                    c.fp8->along_rows(fp8::Role::grad_hidden, dz, M, n * F, dz_columns, !need_dh), M,
                                    H, n * F)
                  : weight_gradient(h, dz, M, H, n * F);
  }
  if (need_dh) {
    // The returned h's gradient joins dh in its product; a sharded node adds it (this rank's rows) to the ranks'
    // summed partial products instead.
    const Tensor<T>* returned_h = sharding.sharded() ? nullptr : dh_out;
    const Addend<T> dh_addend{.matrix = returned_h ? returned_h->data() : nullptr};
    Tensor<T> dh = sharding.summed(
        c.fp8 ? product(Transpose::no, Transpose::yes, M, H, n * F, dz_columns, c.w1q, dh_addend)
              : product(Transpose::no, Transpose::yes, M, H, n * F, dz, c.w1, dh_addend));
    if (sharding.sharded() && dh_out) add_to(dh, dh_out->reshape(dh.shape()));
    auto norm_grads = detail::norm_backward(c.norm, dh, need.x, need.gamma, need.beta);
    g.dx = norm_grads.dx;
    g.dgamma_dbeta = std::move(norm_grads.dgamma_dbeta);
    sharding.sum_row_sums(g.dgamma_dbeta);
  }
  return g;
}

template <class P, class C> Tensor<P> to_param(const std::vector<C>& values, std::size_t offset, const Shape& shape) {
  return detail::rounded_tensor<P>(values.data() + offset, shape);
}
template <class P, class C> Tensor<P> to_param(const Tensor<C>& values, const Shape& shape) {
  return detail::rounded_tensor<P>(values.data(), shape);
}

// Records the node; with WithNorm it has a second output, h.
template <bool WithNorm, class T, class P>
auto record_layernorm_mlp(const MlpDims& dims, const LayerNormMLPOptions& options, const Var<T>& x,
                          const Var<P>& gamma, const Var<P>& beta, const Var<P>& w1, const Var<P>& b1,
                          const Var<P>& w2, const Var<P>& b2, bool has_beta, bool has_b1, bool has_b2) {
  const Shape x_shape = x.shape();
  auto forward = [&](MlpContext<T>& c, const Tensor<T>& xv, const Tensor<P>& gv, const Tensor<P>& bv,
                     const Tensor<P>& w1v, const Tensor<P>& b1v, const Tensor<P>& w2v, const Tensor<P>& b2v) {
    auto outputs = [&](const Tensor<T>& y, const Tensor<T>& h) {
      if constexpr (WithNorm) {
        return std::tuple{y.reshape(x_shape), h.reshape(x_shape)};
      } else {
        return y.reshape(x_shape);
      }
    };
    return by_device(
        op_name, xv.device(),
        [&] {
          c.options = options;
          c.dims = dims;
          c.norm = detail::NormRows<T>(options.norm == NormType::layernorm, xv, gv, has_beta ? &bv : nullptr,
                                       options.zero_centered_gamma);
          if (options.fp8) {
            c.fp8.emplace(op_name, *options.fp8);  // (delayed scaling: ends the state's previous step first)
            c.w1q = c.fp8->weight(fp8::Role::kernel1, w1v, dims.hidden, dims.width * dims.ffn, dims.width);
            c.w2q = c.fp8->weight(fp8::Role::kernel2, w2v, dims.ffn, dims.hidden);
          } else {
            c.w1 = cast<T>(w1v);
            c.w2 = cast<T>(w2v);
          }
          if (has_b1) c.b1 = cast<T>(b1v);
          if (has_b2) c.b2 = cast<T>(b2v);
          const MlpForward<T> out = mlp_forward(c);
          return outputs(out.y, out.h);
        },
        [&](auto) {
          const detail::MlpParams<P> params{gv, has_beta ? &bv : nullptr, w1v, has_b1 ? &b1v : nullptr,
                                            w2v, has_b2 ? &b2v : nullptr};
          const detail::DeviceMlpOutput<T> out = detail::device_mlp_forward(c.device, dims, options, xv, params);
          return outputs(out.y, out.h);
        });
  };
  auto backward = [=](const MlpContext<T>& c, const NeedsGrad& needs, const Tensor<T>& dy, const auto&... dh) {
    const Tensor<T>* dh_out = nullptr;
    ((dh_out = &dh), ...);
    const MlpNeeds need{needs[0], needs[1], has_beta && needs[2], needs[3], has_b1 && needs[4], needs[5],
                        has_b2 && needs[6]};
    return by_device(
        op_name, dy.device(),
        [&] {
          const MlpGrads<T> g = mlp_backward(c, dy, dh_out, need);
          const auto [M, H, F, n] = c.dims;
          auto param = [](bool wanted, auto make) { return wanted ? make() : Tensor<P>(); };
          return std::tuple{
              need.x ? g.dx.reshape(x_shape) : Tensor<T>(),
              param(need.gamma, [&] { return to_param<P>(g.dgamma_dbeta, 0, Shape{H}); }),
              param(need.beta, [&] { return to_param<P>(g.dgamma_dbeta, H, Shape{H}); }),
              param(need.w1, [&] { return to_param<P>(g.dw1, Shape{H, n, F}); }),
              param(need.b1, [&] { return to_param<P>(g.db1, 0, Shape{n, F}); }),
              param(need.w2, [&] { return to_param<P>(g.dw2, Shape{F, H}); }),
              param(need.b2, [&] { return to_param<P>(g.db2, 0, Shape{H}); }),
          };
        },
        [&](auto) {
          const detail::DeviceMlpGrads<T, P> g = detail::device_mlp_backward<T, P>(c.device, dy, dh_out, need);
          return std::tuple{need.x ? g.dx.reshape(x_shape) : Tensor<T>(), g.dgamma, g.dbeta, g.dw1, g.db1, g.dw2,
                            g.db2};
        });
  };
  if constexpr (WithNorm) {
    return custom_op<MlpContext<T>>(
        op_name, forward,
        [backward](const MlpContext<T>& c, const NeedsGrad& needs, const Tensor<T>& dy, const Tensor<T>& dh) {
          return backward(c, needs, dy, dh);
        },
        x, gamma, beta, w1, b1, w2, b2);
  } else {
    return custom_op<MlpContext<T>>(
        op_name, forward,
        [backward](const MlpContext<T>& c, const NeedsGrad& needs, const Tensor<T>& dy) {
          return backward(c, needs, dy);
        },
        x, gamma, beta, w1, b1, w2, b2);
  }
}

}  // namespace

std::string_view recompute_name(Recompute recompute) {
  switch (recompute) {
    case Recompute::save_all: return "save_all";
    case Recompute::recompute_norm: return "recompute_norm";
    case Recompute::recompute_all: return "recompute_all";
  }
  return "?";
}

template <class T, class P>
LayerNormMLPOutput<T> layernorm_mlp(const Var<T>& x, const Var<P>& gamma, const Var<P>& beta,
                                    const MLPKernels<P>& kernels, const MLPBiases<P>& biases,
                                    const LayerNormMLPOptions& options) {
  const MlpDims dims = detail::check_mlp_arguments(op_name, x, gamma, beta, kernels, biases, options);
  // Absent inputs take the place of an empty constant: one node type serves every combination.
  const Var<P> absent = constant(Tensor<P>(Shape{0}, x.device()));
  auto or_absent = [&](const Var<P>& v) { return v.defined() ? v : absent; };
  const bool has_beta = beta.defined(), has_b1 = biases.b1.defined(), has_b2 = biases.b2.defined();
  if (options.return_layernorm_output) {
    auto [y, h] = record_layernorm_mlp<true>(dims, options, x, gamma, or_absent(beta), kernels.w1,
                                             or_absent(biases.b1), kernels.w2, or_absent(biases.b2), has_beta,
                                             has_b1, has_b2);
    return {y, h};
  }
  return {record_layernorm_mlp<false>(dims, options, x, gamma, or_absent(beta), kernels.w1, or_absent(biases.b1),
                                      kernels.w2, or_absent(biases.b2), has_beta, has_b1, has_b2),
          {}};
}

#define TAPEGRAD_INSTANTIATE_LAYERNORM_MLP_PARAMS(T, P)                                                   \
  template LayerNormMLPOutput<T> layernorm_mlp<T, P>(const Var<T>&, const Var<P>&, const Var<P>&,         \
                                                     const MLPKernels<P>&, const MLPBiases<P>&,           \
                                                     const LayerNormMLPOptions&);
#define TAPEGRAD_INSTANTIATE_LAYERNORM_MLP(T)                 \
  TAPEGRAD_INSTANTIATE_LAYERNORM_MLP_PARAMS(T, float)         \
  TAPEGRAD_INSTANTIATE_LAYERNORM_MLP_PARAMS(T, double)        \
  TAPEGRAD_INSTANTIATE_LAYERNORM_MLP_PARAMS(T, ::tapegrad::bf16) \
  TAPEGRAD_INSTANTIATE_LAYERNORM_MLP_PARAMS(T, ::tapegrad::f16)
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_LAYERNORM_MLP)

}  // namespace tapegrad

// layernorm_mlp: the node. Its forward and backward run the stages of detail/stages.hpp on the backend of x's
// device, the CPU's (detail/cpu_steps.hpp) or the GPU's (detail/gpu_steps.hpp); the context holds what that
// backend's forward saved.
#include "tapegrad/ops/layernorm_mlp/layernorm_mlp.hpp"

#include <string>
#include <tuple>
#include <type_traits>

#include "tapegrad/autodiff/custom_op.hpp"
#include "tapegrad/ops/detail/row_sum.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/check.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/cpu_steps.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/gpu_steps.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/recorded_backward.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"

namespace tapegrad {

namespace {

constexpr const char* op_name = "layernorm_mlp";
using detail::mlp::Dims;
using detail::mlp::Needs;

// What the forward keeps for the backward, on x's device. Mutable: the GPU backward gives up the saved h and z as
// soon as it is done with them (a second backward under retain_graph makes them again, bitwise the same).
template <class T> struct Context {
  mutable detail::mlp::CpuSaved<T> cpu;
  mutable detail::mlp::GpuSaved<T> gpu;
};

// A parameter's gradient in P [shape]: the CPU's, summed in C, rounded once; the GPU's as it comes.
template <class P, class C> Tensor<P> to_param(const Tensor<C>& sums, const Shape& shape) {
  if (!sums.defined()) return {};
  if constexpr (std::is_same_v<P, C>) {
    return sums.reshape(shape);
  } else {
    return detail::rounded_tensor<P>(sums.data(), shape);
  }
}

// Records the node; with WithNorm it has a second output, h.
template <bool WithNorm, class T, class P>
auto record_layernorm_mlp(const Dims& dims, const LayerNormMLPOptions& options, const Var<T>& x, const Var<P>& gamma,
                          const Var<P>& beta, const Var<P>& w1, const Var<P>& b1, const Var<P>& w2, const Var<P>& b2,
                          bool has_beta, bool has_b1, bool has_b2) {
  const Shape x_shape = x.shape();
  auto forward = [&](Context<T>& c, const Tensor<T>& xv, const Tensor<P>& gv, const Tensor<P>& bv,
                     const Tensor<P>& w1v, const Tensor<P>& b1v, const Tensor<P>& w2v, const Tensor<P>& b2v) {
    const detail::mlp::Params<P> params{gv, has_beta ? &bv : nullptr, w1v, has_b1 ? &b1v : nullptr,
                                        w2v, has_b2 ? &b2v : nullptr};
    const detail::mlp::Forward<T> out = by_device(
        op_name, xv.device(), [&] { return detail::mlp::cpu_forward(c.cpu, dims, options, xv, params); },
        [&](auto) { return detail::mlp::gpu_forward(c.gpu, dims, options, xv, params); });
    if constexpr (WithNorm) {
      return std::tuple{out.y.reshape(x_shape), out.h.reshape(x_shape)};
    } else {
      return out.y.reshape(x_shape);
    }
  };
  auto backward = [=](const Context<T>& c, const NeedsGrad& needs, const Tensor<T>& dy, const auto&... dh) {
    const Tensor<T>* dh_out = nullptr;
    ((dh_out = &dh), ...);
    const Needs need{needs[0], needs[1], has_beta && needs[2], needs[3], has_b1 && needs[4], needs[5],
                     has_b2 && needs[6]};
    const auto [M, H, F, n] = dims;
    const auto gradients = [&](const auto& g) {
      return std::tuple{need.x ? g.dx.reshape(x_shape) : Tensor<T>(), to_param<P>(g.dgamma, Shape{H}),
                        to_param<P>(g.dbeta, Shape{H}),   to_param<P>(g.dw1, Shape{H, n, F}),
                        to_param<P>(g.db1, Shape{n, F}),  to_param<P>(g.dw2, Shape{F, H}),
                        to_param<P>(g.db2, Shape{H})};
    };
    return by_device(
        op_name, dy.device(), [&] { return gradients(detail::mlp::cpu_backward(c.cpu, dy, dh_out, need)); },
        [&](auto) { return gradients(detail::mlp::gpu_backward<T, P>(c.gpu, dy, dh_out, need)); });
  };
  // Under create_graph: the same gradients, recorded (detail/recorded_backward.hpp); dh as for backward.
  const detail::mlp::Present present{has_beta, has_b1, has_b2};
  const auto recorded = [options, present](const Context<T>&, const NeedsGrad&,
                                           const detail::mlp::NodeVars<T, P>& inputs, const Var<T>& dy,
                                           const auto&... dh) {
    Var<T> dh_out;
    ((dh_out = dh), ...);
    return detail::mlp::recorded_backward<T, P>(options, present, inputs, dy, dh_out);
  };
  if constexpr (WithNorm) {
    return custom_op<Context<T>>(
        op_name, forward,
        [backward](const Context<T>& c, const NeedsGrad& needs, const Tensor<T>& dy, const Tensor<T>& dh) {
          return backward(c, needs, dy, dh);
        },
        graph_backward(recorded), x, gamma, beta, w1, b1, w2, b2);
  } else {
    return custom_op<Context<T>>(
        op_name, forward,
        [backward](const Context<T>& c, const NeedsGrad& needs, const Tensor<T>& dy) { return backward(c, needs, dy); },
        graph_backward(recorded), x, gamma, beta, w1, b1, w2, b2);
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
  const Dims dims = detail::mlp::check_arguments(op_name, x, gamma, beta, kernels, biases, options);
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

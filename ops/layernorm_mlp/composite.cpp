#include "tapegrad/ops/layernorm_mlp/composite.hpp"

#include "tapegrad/ops/activation.hpp"
#include "tapegrad/ops/detail/unfused.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/activation_table.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/check.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/composite_stages.hpp"
#include "tapegrad/ops/layout.hpp"
#include "tapegrad/ops/matmul.hpp"
#include "tapegrad/ops/norm.hpp"

namespace tapegrad {

namespace detail::mlp {

template <class T>
Var<T> composite_norm(const Var<T>& x, const Var<T>& gamma, const Var<T>& beta, const LayerNormMLPOptions& options) {
  const NormOptions norm{.epsilon = options.epsilon, .zero_centered_gamma = options.zero_centered_gamma};
  return options.norm == NormType::rmsnorm ? rmsnorm(x, gamma, norm)
         : beta.defined()                   ? layernorm(x, gamma, beta, norm)
                                            : layernorm(x, gamma, norm);
}

// With the library's precompiled single-op kernels (ops/detail/unfused.hpp): no expression of its own to compile in
// four dtypes.
template <class T> Var<T> composite_activation(const Var<T>& z, std::int64_t F, const LayerNormMLPOptions& o) {
  using V = Unfused<T>;
  const ActivationForm form = activation_form(o, "layernorm_mlp_composite");
  const double L = form.limit;
  const V z0{form.gate == ActivationGate::none ? z : slice(z, -1, 0, F)};
  const auto relu = [](const V& x) { return x.apply(ops::Relu{}); };
  const V fn = [&] {
    switch (form.fn) {
      case ActivationFunction::relu: return relu(z0);
      case ActivationFunction::gelu_tanh: return z0.apply(ops::GeluTanh{});
      case ActivationFunction::swish: return z0.apply(ops::Silu{{form.alpha}});  // x·σ(alpha·x)
      case ActivationFunction::squared_relu: return z0.apply(ops::SquaredRelu{});
      case ActivationFunction::sigmoid: return z0.apply(ops::Sigmoid{});
      case ActivationFunction::clamped_swish: {
        const V z0c = z0 - relu(z0 + -L);  // min(z₀, L)
        return z0c * (z0c * form.alpha).apply(ops::Sigmoid{});
      }
    }
    throw Error("layernorm_mlp_composite: unknown activation function");
  }();
  if (form.gate == ActivationGate::none) return fn.v;
  const V z1{slice(z, -1, F, 2 * F)};
  if (form.gate == ActivationGate::linear) return (fn * z1).v;
  const V z1c = z1 - relu(z1 + -L) + relu(z1.apply(ops::ScalarMinus{-L}));  // clamp(z₁, -L, L)
  return (fn * (z1c + 1.0)).v;
}

}  // namespace detail::mlp

template <class T>
LayerNormMLPOutput<T> layernorm_mlp_composite(const Var<T>& x, const Var<T>& gamma, const Var<T>& beta,
                                              const MLPKernels<T>& kernels, const MLPBiases<T>& biases,
                                              const LayerNormMLPOptions& options) {
  const detail::mlp::Dims dims =
      detail::mlp::check_arguments("layernorm_mlp_composite", x, gamma, beta, kernels, biases, options);
  check(!options.fp8, "layernorm_mlp_composite",
        "fp8 quantization is the node's alone: the composite of primitive ops multiplies T values");
  const Var<T> h = detail::mlp::composite_norm(x, gamma, beta, options);
  const std::int64_t H = dims.hidden, n = dims.width, F = dims.ffn;
  Var<T> z = matmul(h, reshape(kernels.w1, {H, n * F}));
  if (biases.b1.defined()) z = (detail::Unfused<T>{z} + detail::Unfused<T>{reshape(biases.b1, {n * F})}).v;
  Var<T> y = matmul(detail::mlp::composite_activation(z, F, options), kernels.w2);
  if (biases.b2.defined()) y = (detail::Unfused<T>{y} + detail::Unfused<T>{biases.b2}).v;
  if (options.residual) y = (detail::Unfused<T>{y} + detail::Unfused<T>{x}).v;
  return {y, options.return_layernorm_output ? h : Var<T>()};
}

#define TAPEGRAD_INSTANTIATE_LAYERNORM_MLP_COMPOSITE(T)                                                      \
  template Var<T> detail::mlp::composite_norm<T>(const Var<T>&, const Var<T>&, const Var<T>&,                \
                                                 const LayerNormMLPOptions&);                                \
  template Var<T> detail::mlp::composite_activation<T>(const Var<T>&, std::int64_t, const LayerNormMLPOptions&); \
  template LayerNormMLPOutput<T> layernorm_mlp_composite<T>(const Var<T>&, const Var<T>&, const Var<T>&,     \
                                                            const MLPKernels<T>&, const MLPBiases<T>&,       \
                                                            const LayerNormMLPOptions&);
// Every dtype: the node's create_graph backward records it in the node's compute dtype (recorded_backward.cpp).
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_LAYERNORM_MLP_COMPOSITE)

}  // namespace tapegrad

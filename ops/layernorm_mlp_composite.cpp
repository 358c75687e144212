#include "ops/layernorm_mlp_composite.hpp"

#include "ops/activation.hpp"
#include "ops/layernorm_mlp_check.hpp"
#include "ops/layout.hpp"
#include "ops/matmul.hpp"
#include "ops/norm.hpp"

namespace tapegrad {

namespace {

// The activation of z [..., n·F]: z₀ = z[..., :F] and, for gated ones, z₁ = z[..., F:].
template <class T> Var<T> activation_of(const Var<T>& z, std::int64_t F, const LayerNormMLPOptions& o) {
  const Var<T> z0 = slice(z, -1, 0, F);
  auto z1 = [&] { return slice(z, -1, F, 2 * F); };
  switch (o.activation) {
    case Activation::relu: return relu(z0);
    case Activation::gelu: return gelu_tanh(z0);
    case Activation::silu: return silu(z0);
    case Activation::quick_gelu: return quick_gelu(z0);
    case Activation::squared_relu: return squared_relu(z0);
    case Activation::reglu: return relu(z0) * z1();
    case Activation::geglu: return gelu_tanh(z0) * z1();
    case Activation::swiglu: return silu(z0) * z1();
    case Activation::glu: return sigmoid(z0) * z1();
    case Activation::qgeglu: return quick_gelu(z0) * z1();
    case Activation::sreglu: return squared_relu(z0) * z1();
    case Activation::clamped_swiglu: {
      const double L = o.clamped_swiglu.limit, alpha = o.clamped_swiglu.alpha;
      const Var<T> gate = z1();
      const Var<T> z0c = z0 - relu(z0 - L);                    // min(z₀, L)
      const Var<T> z1c = gate - relu(gate - L) + relu(-L - gate);  // clamp(z₁, -L, L)
      return z0c * sigmoid(z0c * alpha) * (z1c + 1.0);
    }
  }
  throw Error("layernorm_mlp_composite: unknown activation");
}

}  // namespace

template <class T>
LayerNormMLPOutput<T> layernorm_mlp_composite(const Var<T>& x, const Var<T>& gamma, const Var<T>& beta,
                                              const MLPKernels<T>& kernels, const MLPBiases<T>& biases,
                                              const LayerNormMLPOptions& options) {
  const detail::MlpDims dims =
      detail::check_mlp_arguments("layernorm_mlp_composite", x, gamma, beta, kernels, biases, options);
  const NormOptions norm{.epsilon = options.epsilon, .zero_centered_gamma = options.zero_centered_gamma};
  const Var<T> h = options.norm == NormType::rmsnorm ? rmsnorm(x, gamma, norm)
                   : beta.defined()                   ? layernorm(x, gamma, beta, norm)
                                                      : layernorm(x, gamma, norm);
  const std::int64_t H = dims.hidden, n = dims.width, F = dims.ffn;
  Var<T> z = matmul(h, reshape(kernels.w1, {H, n * F}));
  if (biases.b1.defined()) z = z + reshape(biases.b1, {n * F});
  Var<T> y = matmul(activation_of(z, F, options), kernels.w2);
  if (biases.b2.defined()) y = y + biases.b2;
  return {y, options.return_layernorm_output ? h : Var<T>()};
}

#define TAPEGRAD_INSTANTIATE_LAYERNORM_MLP_COMPOSITE(T)                                                      \
  template LayerNormMLPOutput<T> layernorm_mlp_composite<T>(const Var<T>&, const Var<T>&, const Var<T>&,     \
                                                            const MLPKernels<T>&, const MLPBiases<T>&,       \
                                                            const LayerNormMLPOptions&);
// f32 and f64 only: what the tests and benchmarks compare against; each dtype costs ~1 CPU-minute of build.
TAPEGRAD_INSTANTIATE_LAYERNORM_MLP_COMPOSITE(float)
TAPEGRAD_INSTANTIATE_LAYERNORM_MLP_COMPOSITE(double)

}  // namespace tapegrad

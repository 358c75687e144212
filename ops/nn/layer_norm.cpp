#include "tapegrad/ops/nn/layer_norm.hpp"

#include "tapegrad/ops/norm.hpp"

namespace tapegrad::nn {

template <class U>
Var<U> normalize(const Var<U>& x, const Var<U>& scale, const Var<U>& ln_bias, const LayerNormConfig& config) {
  const NormOptions options{.epsilon = config.epsilon, .zero_centered_gamma = config.zero_centered_gamma};
  if (config.norm_type == NormType::rmsnorm) {
    check(!ln_bias.defined(), "LayerNorm", "rmsnorm takes no ln_bias");
    return rmsnorm(x, scale, options);
  }
  return ln_bias.defined() ? layernorm(x, scale, ln_bias, options) : layernorm(x, scale, options);
}

#define TAPEGRAD_INSTANTIATE_NORMALIZE(U) \
  template Var<U> normalize<U>(const Var<U>&, const Var<U>&, const Var<U>&, const LayerNormConfig&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_NORMALIZE)

}  // namespace tapegrad::nn

// nn::LayerNorm: layernorm or rmsnorm over the last axis, with a learned scale `scale` [H] and, for layernorm, a
// shift `ln_bias` [H] (TransformerEngine's names). Also the norm configuration and parameters that LayerNormDense,
// LayerNormMLP and MultiHeadAttention share.
//
//   nn::LayerNorm<bf16> norm(128, {.norm_type = NormType::rmsnorm}, /*seed=*/0);
//   Var<bf16> y = norm(x);  // x [..., 128]
#pragma once

#include <cstdint>
#include <optional>

#include "tapegrad/ops/cast.hpp"
#include "tapegrad/ops/dist.hpp"
#include "tapegrad/ops/layernorm_mlp/layernorm_mlp.hpp"
#include "tapegrad/ops/nn/dtypes.hpp"
#include "tapegrad/ops/nn/module.hpp"

namespace tapegrad::nn {

struct LayerNormConfig {
  NormType norm_type = NormType::layernorm;
  double epsilon = 1e-6;
  bool zero_centered_gamma = false;  // scale by 1 + scale (then scale starts at 0)
  bool use_bias = true;              // layernorm's shift ln_bias; rmsnorm has none
  std::optional<Initializer> scale_init{};  // unset: ones, or zeros with zero_centered_gamma
  Initializer ln_bias_init = Initializer::zeros();
};

// The normalization `config` describes, of x [..., H] by scale [H] and ln_bias [H] (undefined: no shift), in U.
template <class U>
Var<U> normalize(const Var<U>& x, const Var<U>& scale, const Var<U>& ln_bias, const LayerNormConfig& config);

// What a norm-then-project module returns when asked for its norm output too.
template <class U> struct LayerNormOutputs {
  Var<U> output;
  Var<U> layernorm_output;
};
template <class U> void describe(const LayerNormOutputs<U>& outputs, TensorInfos& infos) {
  describe(outputs.output, infos);
  describe(outputs.layernorm_output, infos);
}

namespace detail {
// The norm's parameters, registered in `owner` as `scale` and `ln_bias`.
template <class P> struct NormParameters {
  Var<P> scale, ln_bias;  // ln_bias undefined for rmsnorm or without use_bias

  NormParameters(Module& owner, std::int64_t hidden, const LayerNormConfig& config, std::uint64_t seed) {
    check(hidden > 0, owner.type_name(), "the hidden size must be positive, got ", hidden);
    const Initializer ones_or_zeros = config.zero_centered_gamma ? Initializer::zeros() : Initializer::ones();
    owner.init_parameter("scale", scale, config.scale_init.value_or(ones_or_zeros), {hidden}, seed);
    if (config.norm_type == NormType::layernorm && config.use_bias) {
      owner.init_parameter("ln_bias", ln_bias, config.ln_bias_init, {hidden}, seed);
    }
  }
  // x is already in the compute dtype U; the parameters are rounded to it. With `rows_shared_over` (x this rank's
  // rows of a sequence-parallel group), the parameters' gradients are summed over its ranks (dist::replicate).
  template <class U>
  Var<U> apply(const Var<U>& x, const LayerNormConfig& config,
               const dist::Communicator* rows_shared_over = nullptr) const {
    const auto used = [&](const Var<P>& parameter) {
      const Var<U> value = cast<U>(parameter);
      return rows_shared_over ? dist::replicate(*rows_shared_over, value) : value;
    };
    return normalize(x, used(scale), ln_bias.defined() ? used(ln_bias) : Var<U>(), config);
  }
  std::int64_t hidden() const { return scale.shape()[0]; }
};
}  // namespace detail

template <class P, class C = void>
  requires ModuleDtypes<P, C>
class LayerNorm : public Module {
 public:
  LayerNorm(std::int64_t hidden, LayerNormConfig config, std::uint64_t seed, Device device = Device::cpu())
      : Module("LayerNorm", device), config_(std::move(config)), norm_(*this, hidden, config_, seed) {}

  // x [..., H] in any dtype -> [..., H] in the compute dtype.
  template <class T> Var<compute_of<C, T>> operator()(const Var<T>& x) const {
    return traced(
        [this](const Var<T>& x) {
          check_input(x.shape(), norm_.hidden());
          return norm_.apply(cast<compute_of<C, T>>(x), config_);
        },
        x);
  }

  const Var<P>& scale() const { return norm_.scale; }
  const Var<P>& ln_bias() const { return norm_.ln_bias; }
  const LayerNormConfig& config() const { return config_; }

 private:
  LayerNormConfig config_;
  detail::NormParameters<P> norm_;
};

}  // namespace tapegrad::nn

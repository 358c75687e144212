// nn::LayerNormMLP: the transformer's norm-and-MLP block as one module over the fused layernorm_mlp op
// (ops/layernorm_mlp/layernorm_mlp.hpp), with TransformerEngine's parameter names:
//   scale [H], ln_bias [H] (layernorm with use_bias), wi_kernel [H, n, F], wi_bias [n, F], wo_kernel [F, H],
//   wo_bias [H], where n = 2 for gated activations and F = intermediate_dim.
// layernorm_mlp takes the parameters in P as they are (each gradient comes back in P) and rounds the kernels to the
// compute dtype itself; only x is cast here. With an fp8 recipe the node quantizes its products' inputs
// (ops/fp8/recipe.hpp); the parameters stay in P.
//
//   nn::LayerNormMLP<f32, bf16> mlp(128, {.intermediate_dim = 512, .activation = Activation::swiglu}, 0);
//   Var<bf16> y = mlp(x);  // x [..., 128] -> [..., 128]
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tapegrad/ops/fp8/recipe.hpp"
#include "tapegrad/ops/nn/detail/fp8_module.hpp"
#include "tapegrad/ops/layernorm_mlp/layernorm_mlp.hpp"
#include "tapegrad/ops/nn/layer_norm.hpp"

namespace tapegrad::nn {

struct LayerNormMLPConfig {
  std::int64_t intermediate_dim = 2048;
  Activation activation = Activation::gelu;
  ClampedSwigluParams clamped_swiglu{};
  LayerNormConfig norm{};
  bool use_bias = true;  // wi_bias and wo_bias
  Initializer kernel_init = Initializer::lecun_normal();
  Initializer bias_init = Initializer::zeros();
  Recompute recompute = Recompute::save_all;
  bool residual = false;  // output = x + the block, added in the node (LayerNormMLPOptions::residual)
  std::optional<fp8::Recipe> fp8{};  // none: unquantized products; the module owns delayed scaling's state
  // With fp8: keep the kernels' fp8 copies from forward to forward (micro-batches, ops/fp8/weight_cache.hpp) until
  // the module's parameters_changed().
  bool fp8_weight_cache = false;
  // Tensor parallelism over the communicator's ranks (LayerNormMLPOptions::tensor_parallel): the module holds its
  // shard of wi_kernel, wi_bias (their last axis) and wo_kernel (its first), each the block of the whole that an
  // unsharded module of the same seed draws; intermediate_dim is the whole F, a multiple of the rank count.
  std::optional<TensorParallel> tensor_parallel{};
};

template <class P, class C = void>
  requires ModuleDtypes<P, C>
class LayerNormMLP : public Module {
 public:
  LayerNormMLP(std::int64_t hidden, LayerNormMLPConfig config, std::uint64_t seed, Device device = Device::cpu())
      : Module("LayerNormMLP", device), config_(std::move(config)), norm_(*this, hidden, config_.norm, seed) {
    fp8_ = detail::module_fp8(config_.fp8, config_.fp8_weight_cache);
    const std::int64_t n = activation_width(config_.activation), F = config_.intermediate_dim;
    check(F > 0, type_name(), "intermediate_dim must be positive, got ", F);
    // wi_kernel is n matrices [H, F]: fan_in H, fan_out F, each gate its own copy.
    init_parameter("wi_kernel", wi_kernel_, config_.kernel_init, {hidden, n, F}, seed,
                   {.in = {0}, .out = {2}, .batch = {1}}, shard_along(2));
    if (config_.use_bias) init_parameter("wi_bias", wi_bias_, config_.bias_init, {n, F}, seed, {}, shard_along(1));
    init_parameter("wo_kernel", wo_kernel_, config_.kernel_init, {F, hidden}, seed, {}, shard_along(0));
    if (config_.use_bias) init_parameter("wo_bias", wo_bias_, config_.bias_init, {hidden}, seed);
  }

  // x [..., H] in any dtype -> [..., H] in the compute dtype.
  template <class T> Var<compute_of<C, T>> operator()(const Var<T>& x) const {
    return traced([this](const Var<T>& x) { return forward(x, false).output; }, x);
  }
  // {output [..., H], layernorm_output [..., H]}, both in the compute dtype and differentiable.
  template <class T> LayerNormOutputs<compute_of<C, T>> with_layernorm_output(const Var<T>& x) const {
    return traced([this](const Var<T>& x) { return forward(x, true); }, x);
  }

  const Var<P>& scale() const { return norm_.scale; }
  const Var<P>& ln_bias() const { return norm_.ln_bias; }
  const Var<P>& wi_kernel() const { return wi_kernel_; }
  const Var<P>& wi_bias() const { return wi_bias_; }
  const Var<P>& wo_kernel() const { return wo_kernel_; }
  const Var<P>& wo_bias() const { return wo_bias_; }
  // Delayed scaling's amax histories and scales, which every call of the module advances (null for other recipes
  // and without fp8).
  const fp8::ScalingState* fp8_state() const { return fp8_ ? fp8_->state.get() : nullptr; }

  std::vector<std::string> summary_notes() const override { return detail::fp8_notes(fp8_); }

 protected:
  StateDict own_buffers() const override { return detail::fp8_buffers(fp8_); }
  void load_own_buffers(const StateDict& buffers) override { detail::load_fp8_buffers(fp8_, buffers); }
  void own_parameters_changed() override { detail::clear_fp8_weight_cache(fp8_); }

 private:
  template <class T>
  LayerNormOutputs<compute_of<C, T>> forward(const Var<T>& x, bool return_layernorm_output) const {
    check_input(x.shape(), norm_.hidden());
    const LayerNormMLPOptions options{.norm = config_.norm.norm_type,
                                      .zero_centered_gamma = config_.norm.zero_centered_gamma,
                                      .epsilon = config_.norm.epsilon,
                                      .activation = config_.activation,
                                      .clamped_swiglu = config_.clamped_swiglu,
                                      .return_layernorm_output = return_layernorm_output,
                                      .residual = config_.residual,
                                      .recompute = config_.recompute,
                                      .fp8 = fp8_,
                                      .tensor_parallel = config_.tensor_parallel};
    auto [y, h] = layernorm_mlp(cast<compute_of<C, T>>(x), norm_.scale, norm_.ln_bias,
                                MLPKernels<P>{wi_kernel_, wo_kernel_}, MLPBiases<P>{wi_bias_, wo_bias_}, options);
    return {y, h};
  }

  // This rank's shard of the FFN dimension along `axis`, under tensor parallelism.
  std::optional<ParameterShard> shard_along(int axis) const {
    if (!config_.tensor_parallel) return {};
    return ParameterShard{axis, config_.tensor_parallel->comm.rank(), config_.tensor_parallel->comm.size()};
  }

  LayerNormMLPConfig config_;
  std::optional<Fp8Quantization> fp8_;
  detail::NormParameters<P> norm_;
  Var<P> wi_kernel_, wi_bias_, wo_kernel_, wo_bias_;
};

}  // namespace tapegrad::nn

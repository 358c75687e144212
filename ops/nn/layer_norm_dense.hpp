// nn::LayerNormDense: a norm followed by a Dense projection in one module (TransformerEngine's
// LayerNormDenseGeneral), with own parameters `scale`, `ln_bias` (layernorm with use_bias), `kernel` [in, features]
// and `bias` [features].
//
//   nn::LayerNormDense<bf16> proj(128, {.dense = {.features = 384}}, /*seed=*/0);
//   Var<bf16> y = proj(x);                           // norm, then project
//   auto [y2, h] = proj.with_layernorm_output(x);    // also the norm's output h (return_layernorm_output)
//
// The norm output is asked for by calling with_layernorm_output rather than by a config flag, so that the return
// type says what comes back.
#pragma once

#include "tapegrad/ops/nn/dense.hpp"
#include "tapegrad/ops/nn/layer_norm.hpp"

namespace tapegrad::nn {

struct LayerNormDenseConfig {
  DenseConfig dense{};
  LayerNormConfig norm{};
};

template <class P, class C = void>
  requires ModuleDtypes<P, C>
class LayerNormDense : public Module {
 public:
  LayerNormDense(std::int64_t in_features, LayerNormDenseConfig config, std::uint64_t seed,
                 Device device = Device::cpu())
      : Module("LayerNormDense", device),
        config_(std::move(config)),
        norm_(*this, in_features, config_.norm, seed),
        dense_(*this, in_features, config_.dense, seed) {
    check(!config_.dense.tensor_parallel || config_.dense.parallel == DenseConfig::Parallel::column, type_name(),
          "a row-parallel projection would normalize a shard of the features: use column");
  }

  // x [..., in] in any dtype -> [..., features] in the compute dtype.
  template <class T> Var<compute_of<C, T>> operator()(const Var<T>& x) const {
    return traced([this](const Var<T>& x) { return forward(x).output; }, x);
  }
  // {output [..., features], layernorm_output [..., in]}, both in the compute dtype and differentiable.
  template <class T> LayerNormOutputs<compute_of<C, T>> with_layernorm_output(const Var<T>& x) const {
    return traced([this](const Var<T>& x) { return forward(x); }, x);
  }

  const Var<P>& scale() const { return norm_.scale; }
  const Var<P>& ln_bias() const { return norm_.ln_bias; }
  const Var<P>& kernel() const { return dense_.kernel; }
  const Var<P>& bias() const { return dense_.bias; }
  // With `.dense.fp8`: delayed scaling's state, which every call advances (null for other recipes and without fp8).
  const fp8::ScalingState* fp8_state() const { return dense_.fp8_state(); }
  std::vector<std::string> summary_notes() const override { return detail::fp8_notes(dense_.fp8); }

 protected:
  StateDict own_buffers() const override { return detail::fp8_buffers(dense_.fp8); }
  void load_own_buffers(const StateDict& buffers) override { detail::load_fp8_buffers(dense_.fp8, buffers); }
  void own_parameters_changed() override { detail::clear_fp8_weight_cache(dense_.fp8); }

 private:
  template <class T> LayerNormOutputs<compute_of<C, T>> forward(const Var<T>& x) const {
    check_input(x.shape(), norm_.hidden());
    const auto& parallel = config_.dense.tensor_parallel;
    const bool rows_shared = parallel && parallel->sequence_parallel;
    const Var<compute_of<C, T>> h =
        norm_.apply(cast<compute_of<C, T>>(x), config_.norm, rows_shared ? &parallel->comm : nullptr);
    return {dense_.apply(h), h};
  }

  LayerNormDenseConfig config_;
  detail::NormParameters<P> norm_;
  detail::DenseParameters<P> dense_;
};

}  // namespace tapegrad::nn

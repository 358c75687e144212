// A small model built from the nn modules, as a user would write one: a LayerNormDense projection followed by
// multi-head self-attention. The example model_summary prints its summary, and the tests run issue 3's dtype
// scenario on it.
#pragma once

#include <cstdint>

#include <tapegrad/tapegrad.hpp>

namespace tapegrad::examples {

// x [B, S, H] -> [B, S, H]. P: the parameters' dtype; C: the compute dtype (void: the input's).
template <class P, class C = void> class ProjectAttend : public nn::Module {
 public:
  ProjectAttend(std::int64_t hidden, const nn::MultiHeadAttentionConfig& attention, std::uint64_t seed,
                Device device = Device::cpu())
      : Module("ProjectAttend", device),
        proj_(hidden, {.dense = {.features = hidden}}, nn::derive_seed(seed, "proj"), device),
        attn_(hidden, attention, nn::derive_seed(seed, "attn"), device) {
    add_child("proj", proj_);
    add_child("attn", attn_);
  }

  template <class T> Var<nn::compute_of<C, T>> operator()(const Var<T>& x) const {
    return traced([this](const Var<T>& x) { return attn_(proj_(x)); }, x);
  }

 private:
  nn::LayerNormDense<P, C> proj_;
  nn::MultiHeadAttention<P, C> attn_;
};

}  // namespace tapegrad::examples

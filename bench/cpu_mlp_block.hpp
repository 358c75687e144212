// The layernorm_mlp block the CPU benchmarks run (bench/layernorm_mlp.cpp, bench/higher_order.cpp): two sizes, two
// activations, LN with biases, inputs drawn with fixed seeds at scales that keep the activations in their curved range.
#pragma once

#include <cmath>
#include <vector>

#include "tapegrad/tapegrad.hpp"

namespace bench {

struct MLPBlockConfig {
  std::int64_t M, H, F;
};
inline constexpr MLPBlockConfig mlp_block_configs[] = {{64, 64, 256}, {256, 256, 1024}};
inline constexpr tapegrad::Activation mlp_block_activations[] = {tapegrad::Activation::gelu,
                                                                 tapegrad::Activation::swiglu};

// x, gamma, beta, w1, b1, w2, b2: layernorm_mlp's inputs in its order.
template <class T>
std::vector<tapegrad::Tensor<T>> mlp_block_inputs(const MLPBlockConfig& cfg, tapegrad::Activation activation) {
  using tapegrad::randn;
  const std::int64_t n = tapegrad::activation_width(activation);
  return {randn<T>({cfg.M, cfg.H}, 1),
          randn<T>({cfg.H}, 2, 1.0, 0.1),
          randn<T>({cfg.H}, 3, 0.0, 0.1),
          randn<T>({cfg.H, n, cfg.F}, 4, 0.0, 1.0 / std::sqrt(double(cfg.H))),
          randn<T>({n, cfg.F}, 6, 0.0, 0.1),
          randn<T>({cfg.F, cfg.H}, 5, 0.0, 1.0 / std::sqrt(double(cfg.F))),
          randn<T>({cfg.H}, 7, 0.0, 0.1)};
}

}  // namespace bench

// The optimizers' per-element update rules, written once for the CPU loop (ops/optim/*.cpp) and the fused CUDA
// kernels (cuda/optim.cu), so that an update computes the same bits on every device. Plain C++ with no Eigen and no
// tape; S is the state precision (ops/optim/optimizer.hpp: f32, or f64 for f64 parameters).
//
// A rule is built on the host for one parameter's update (its coefficients rounded to S there) and applied to
// element i as rule(p, g, state, i): p and g are the parameter and its gradient already in S, p is updated in
// place, and state[k][i] is element i of state buffer k. Every multiply-add is an explicit fma and no other product
// feeds a sum (compilers fuse such pairs at will: g++ with -march=native, nvcc and ptxas by default); the other
// operations (+, -, ·, /, sqrt) are correctly rounded on both devices, so no compiler's choice can change a bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "tapegrad/tensor/core/detail/host_device.hpp"

namespace tapegrad::optim {

// The most state buffers a rule keeps per parameter (Adam's two moments).
inline constexpr int max_state_buffers = 2;

// SGD (ops/optim/sgd.hpp): one state buffer, the momentum, when `momentum` is non-zero.
template <class S> struct SGDRule {
  S lr, momentum, damped, weight_decay;  // damped = 1 - dampening
  bool use_momentum, nesterov;
  bool first;  // the parameter's first update: the momentum buffer starts as the gradient

  TAPEGRAD_HOST_DEVICE void operator()(S& p, S g, S* const* state, std::int64_t i) const {
    g = std::fma(weight_decay, p, g);
    if (use_momentum) {
      S& b = state[0][i];
      b = first ? g : std::fma(momentum, b, damped * g);
      g = nesterov ? std::fma(momentum, b, g) : b;
    }
    p = std::fma(-lr, g, p);
  }
};

// Adam and AdamW (ops/optim/adam.hpp): two state buffers, the moments m and v.
template <class S> struct AdamRule {
  S beta1, beta2, eps, weight_decay;
  S decay;                  // 1 - lr·weight_decay (AdamW)
  S step_size;              // lr / (1 - beta1^t)
  S bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  bool decoupled;           // AdamW: decay the parameter, not the gradient

  TAPEGRAD_HOST_DEVICE void operator()(S& p, S g, S* const* state, std::int64_t i) const {
    S& m = state[0][i];
    S& v = state[1][i];
    if (!decoupled) g = std::fma(weight_decay, p, g);
    m = std::fma(beta1, m, (1 - beta1) * g);
    v = std::fma(beta2, v, (1 - beta2) * g * g);
    const S step = step_size * m / (std::sqrt(v) / bias_correction2_sqrt + eps);
    // AdamW's decay and the step in one rounding: p·decay - step as two operations is a multiply-add too.
    p = decoupled ? std::fma(p, decay, -step) : p - step;
  }
};

}  // namespace tapegrad::optim

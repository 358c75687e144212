// The parts an activation of layernorm_mlp is made of, as plain values that the CPU's row kernels, the GPU's activation
// kernel and the composite reference dispatch on. Each activation is one row of
// ops/layernorm_mlp/detail/activation_table.hpp; the formulas of the parts are cuda/detail/activation_math.hpp's (and,
// vectorized, ops/detail/activation_arrays.hpp's).
#pragma once

#include <cstdint>

#include "tapegrad/tensor/core/detail/host_device.hpp"

namespace tapegrad {

// a = fn(z₀) · gate(z₁), or a = fn(z₀) without a gate.
enum class ActivationFunction : std::uint8_t { relu, gelu_tanh, swish, squared_relu, sigmoid, clamped_swish };
enum class ActivationGate : std::uint8_t { none, linear, clamped_linear };

struct ActivationForm {
  ActivationFunction fn = ActivationFunction::gelu_tanh;
  ActivationGate gate = ActivationGate::none;
  double alpha = 1.0;  // swish, clamped_swish: the sigmoid's slope
  double limit = 0.0;  // clamped_swish and clamped_linear: the clamp
  TAPEGRAD_HOST_DEVICE int width() const { return gate == ActivationGate::none ? 1 : 2; }
};

}  // namespace tapegrad

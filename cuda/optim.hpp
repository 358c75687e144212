// Optimizer updates on the GPU: one fused kernel per update rule (cuda/detail/update_rules.hpp, the CPU's rules) reads
// each element of a parameter, its gradient and its state, and writes the state and the parameter in place, the
// parameter rounded once to its dtype. Plain C++ (see tensor/gpu/backend.hpp for how callers use it).
#pragma once

#include <array>
#include <cstdint>

#include "tapegrad/tensor/core/dtype_tag.hpp"
#include "tapegrad/cuda/detail/update_rules.hpp"

namespace tapegrad::cuda {

// One parameter on GPU `device`: `size` elements of the parameter and its gradient in `dtype`, and of each state
// buffer in the state precision (f64 for an f64 parameter, else f32; null beyond the rule's buffer count).
struct ParameterBuffers {
  DType dtype;
  void* param;
  const void* grad;
  std::array<void*, optim::max_state_buffers> state;
  std::int64_t size;
  int device;
};

// For each element: p and g widened to the rule's precision, rule(p, g, state, i), p rounded back to nearest even;
// queued on the device's current stream. A rule in double updates f64 parameters, one in float the others.
void optimizer_step(const ParameterBuffers& buffers, const optim::SGDRule<float>& rule);
void optimizer_step(const ParameterBuffers& buffers, const optim::SGDRule<double>& rule);
void optimizer_step(const ParameterBuffers& buffers, const optim::AdamRule<float>& rule);
void optimizer_step(const ParameterBuffers& buffers, const optim::AdamRule<double>& rule);

}  // namespace tapegrad::cuda

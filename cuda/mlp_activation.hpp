// The activation step of layernorm_mlp on the GPU: a = fn(z₀)·gate(z₁) over rows of z = [z₀ | z₁] (z₁ only for
// gated activations), and its backward dz = da·∂a/∂z. The same formulas as the CPU's ops/mlp_activation.hpp, per
// element from cuda/activation_math.hpp. Plain C++.
#pragma once

#include <cstdint>

#include "tensor/dtype_tag.hpp"
#include "tensor/host_device.hpp"

namespace tapegrad::cuda {

enum class MlpFunction : std::uint8_t { relu, gelu_tanh, swish, squared_relu, sigmoid, clamped_swish };
enum class MlpGate : std::uint8_t { none, linear, clamped_linear };

struct MlpActivation {
  MlpFunction fn = MlpFunction::gelu_tanh;
  MlpGate gate = MlpGate::none;
  double alpha = 1.0;  // swish, clamped_swish: the sigmoid's slope
  double limit = 0.0;  // clamped_swish and clamped_linear: the clamp
  TAPEGRAD_HOST_DEVICE int width() const { return gate == MlpGate::none ? 1 : 2; }
};

// z [rows, width·F] → a [rows, F].
void mlp_activation_forward(DType dtype, int device, const MlpActivation& act, const void* z, void* a,
                            std::int64_t rows, std::int64_t F);
// z [rows, width·F], da [rows, F] → dz [rows, width·F], and a [rows, F] unless `a` is null.
void mlp_activation_backward(DType dtype, int device, const MlpActivation& act, const void* z, const void* da,
                             void* a, void* dz, std::int64_t rows, std::int64_t F);

}  // namespace tapegrad::cuda

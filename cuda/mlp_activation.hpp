// The activation step of layernorm_mlp on the GPU: a = fn(z₀)·gate(z₁) over rows of z = [z₀ | z₁] (z₁ only for gated
// activations), and its backward dz = da·∂a/∂z with the bias gradient Σ_rows dz. The same formulas as the CPU's
// ops/mlp_activation.hpp, per element from cuda/activation_math.hpp. Plain C++.
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

struct MlpActivationGrads {
  void* dz = nullptr;     // [rows, width·F] in dtype; may be z itself (each element is read, then written)
  void* a = nullptr;      // [rows, F]: a = act(z), bitwise the forward's, for dW2; may be da itself; null: none
  void* dbias = nullptr;  // [width·F] = Σ_rows dz (of dz as rounded to dtype), summed in the compute type; null: none
  void* partials = nullptr;  // scratch for dbias: mlp_activation_partials(rows, F, width) elements of the compute type
  bool wide_dbias = false;   // dbias in the compute type (rounded once to it) instead of dtype
};

// The scratch mlp_activation_backward needs for dbias, in elements of the compute type: a partial column sum per
// chunk of rows. The chunks depend on the shape only, so dbias does not depend on the GPU model.
std::int64_t mlp_activation_partials(std::int64_t rows, std::int64_t F, int width);

// z [rows, width·F], da [rows, F] → dz, and a and dbias where asked for: ONE kernel reads z and da once, writes dz,
// a and each chunk's partial column sums of dz; a second adds the partials in a fixed order (no atomics: bitwise
// the same on every run).
void mlp_activation_backward(DType dtype, int device, const MlpActivation& act, const void* z, const void* da,
                             const MlpActivationGrads& out, std::int64_t rows, std::int64_t F);

}  // namespace tapegrad::cuda

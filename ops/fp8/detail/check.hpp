// What an op with fp8 quantization checks of it (layernorm_mlp, fp8_dense). Internal to ops/.
#pragma once

#include <string_view>

#include "tapegrad/ops/fp8/recipe.hpp"
#include "tapegrad/tensor/core/device.hpp"
#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::detail {

// Throws naming `op` where delayed scaling has no state or one made with another recipe, or a format is no Formats.
void check_fp8_quantization(std::string_view op, const Fp8Quantization& q);

// What fp8 quantization takes on x's device: on a GPU, x in f32, bf16 or f16.
void check_fp8_on_device(std::string_view op, DType x_dtype, Device device);

}  // namespace tapegrad::detail

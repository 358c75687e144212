// The tensors an op's FP8 quantization tells apart, each with its own scale and amax history (ops/fp8/recipe.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace tapegrad::fp8 {

// The tensors layernorm_mlp quantizes, as TransformerEngine's quantizer sets name them: GEMM1's input h and kernel
// W1, GEMM2's input a and kernel W2, and the gradients dy (of y) and dz (of GEMM1's output).
enum class Role : std::uint8_t { input, kernel1, activation, kernel2, grad_output, grad_hidden };
inline constexpr int role_count = 6;
inline constexpr std::array<Role, role_count> roles{Role::input,   Role::kernel1,     Role::activation,
                                                    Role::kernel2, Role::grad_output, Role::grad_hidden};

std::string_view role_name(Role role);  // "h", "w1", "a", "w2", "dy", "dz"
bool is_gradient(Role role);
bool is_weight(Role role);

}  // namespace tapegrad::fp8

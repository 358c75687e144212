// layernorm_mlp's activations, one row each: the name the API and its errors use, and the function and gate the
// activation is made of (tensor/core/mlp_activation.hpp), on which the CPU's row kernels (ops/mlp_activation.hpp),
// the GPU's activation kernel (cuda/mlp_activation.hpp) and the composite reference (ops/layernorm_mlp_composite.cpp)
// dispatch. A new activation is a new row, plus its function or gate in those three places if it brings a new one.
// Internal to ops/.
#pragma once

#include <array>
#include <string_view>

#include "tapegrad/ops/layernorm_mlp.hpp"
#include "tapegrad/tensor/core/activation_math.hpp"
#include "tapegrad/tensor/core/mlp_activation.hpp"

namespace tapegrad::detail {

struct ActivationRow {
  Activation activation;
  std::string_view name;
  MlpActivation form;  // clamped_swiglu's alpha and limit come from the options (activation_form)
};

inline constexpr std::array<ActivationRow, 12> activation_rows{{
    {Activation::relu, "relu", {MlpFunction::relu, MlpGate::none}},
    {Activation::gelu, "gelu", {MlpFunction::gelu_tanh, MlpGate::none}},
    {Activation::silu, "silu", {MlpFunction::swish, MlpGate::none, 1.0}},
    {Activation::quick_gelu, "quick_gelu", {MlpFunction::swish, MlpGate::none, activation::quick_gelu_alpha}},
    {Activation::squared_relu, "squared_relu", {MlpFunction::squared_relu, MlpGate::none}},
    {Activation::reglu, "reglu", {MlpFunction::relu, MlpGate::linear}},
    {Activation::geglu, "geglu", {MlpFunction::gelu_tanh, MlpGate::linear}},
    {Activation::swiglu, "swiglu", {MlpFunction::swish, MlpGate::linear, 1.0}},
    {Activation::glu, "glu", {MlpFunction::sigmoid, MlpGate::linear}},
    {Activation::qgeglu, "qgeglu", {MlpFunction::swish, MlpGate::linear, activation::quick_gelu_alpha}},
    {Activation::sreglu, "sreglu", {MlpFunction::squared_relu, MlpGate::linear}},
    {Activation::clamped_swiglu, "clamped_swiglu", {MlpFunction::clamped_swish, MlpGate::clamped_linear}},
}};

// The row of `activation`; throws naming `op` for a value outside the enum.
const ActivationRow& activation_row(Activation activation, std::string_view op = "layernorm_mlp");
// The activation `options` asks for, its parameters included.
MlpActivation activation_form(const LayerNormMLPOptions& options, std::string_view op = "layernorm_mlp");

}  // namespace tapegrad::detail

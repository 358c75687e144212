// layernorm_mlp's activations, one row each: the name the API and its errors use, and the function and gate the
// activation is made of (cuda/activation_form.hpp), on which the CPU's row kernels (detail/cpu_activation.hpp), the
// GPU's activation kernel (cuda/mlp_activation.hpp) and the composite reference (composite.cpp) dispatch. A new
// activation is a new row, plus its function or gate in those three places if it brings a new one. Internal to
// ops/layernorm_mlp/.
#pragma once

#include <array>
#include <string_view>

#include "tapegrad/cuda/activation_form.hpp"
#include "tapegrad/cuda/detail/activation_math.hpp"
#include "tapegrad/ops/layernorm_mlp/layernorm_mlp.hpp"

namespace tapegrad::detail::mlp {

struct ActivationRow {
  Activation activation;
  std::string_view name;
  ActivationForm form;  // clamped_swiglu's alpha and limit come from the options (activation_form)
};

// (Short names for the table.)
using Fn = ActivationFunction;
using Gate = ActivationGate;
inline constexpr double quick = activation::quick_gelu_alpha;

inline constexpr std::array<ActivationRow, 12> activation_rows{{
    {Activation::relu, "relu", {Fn::relu, Gate::none}},
    {Activation::gelu, "gelu", {Fn::gelu_tanh, Gate::none}},
    {Activation::silu, "silu", {Fn::swish, Gate::none, 1.0}},
    {Activation::quick_gelu, "quick_gelu", {Fn::swish, Gate::none, quick}},
    {Activation::squared_relu, "squared_relu", {Fn::squared_relu, Gate::none}},
    {Activation::reglu, "reglu", {Fn::relu, Gate::linear}},
    {Activation::geglu, "geglu", {Fn::gelu_tanh, Gate::linear}},
    {Activation::swiglu, "swiglu", {Fn::swish, Gate::linear, 1.0}},
    {Activation::glu, "glu", {Fn::sigmoid, Gate::linear}},
    {Activation::qgeglu, "qgeglu", {Fn::swish, Gate::linear, quick}},
    {Activation::sreglu, "sreglu", {Fn::squared_relu, Gate::linear}},
    {Activation::clamped_swiglu, "clamped_swiglu", {Fn::clamped_swish, Gate::clamped_linear}},
}};

// The row of `activation`; throws naming `op` for a value outside the enum.
const ActivationRow& activation_row(Activation activation, std::string_view op = "layernorm_mlp");
// The activation `options` asks for, its parameters included.
ActivationForm activation_form(const LayerNormMLPOptions& options, std::string_view op = "layernorm_mlp");

}  // namespace tapegrad::detail::mlp

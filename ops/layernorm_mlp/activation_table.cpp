#include "tapegrad/ops/layernorm_mlp/detail/activation_table.hpp"

#include <string>

#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad {

namespace detail::mlp {

const ActivationRow& activation_row(Activation activation, std::string_view op) {
  for (const ActivationRow& row : activation_rows) {
    if (row.activation == activation) return row;
  }
  throw Error(concat(op, ": unknown activation ", static_cast<int>(activation)));
}

ActivationForm activation_form(const LayerNormMLPOptions& options, std::string_view op) {
  ActivationForm form = activation_row(options.activation, op).form;
  if (form.fn == ActivationFunction::clamped_swish) {
    form.alpha = options.clamped_swiglu.alpha;
    form.limit = options.clamped_swiglu.limit;
  }
  return form;
}

}  // namespace detail::mlp

std::string_view activation_name(Activation activation) { return detail::mlp::activation_row(activation).name; }

Activation activation_from_name(std::string_view name) {
  std::string names;
  for (const detail::mlp::ActivationRow& row : detail::mlp::activation_rows) {
    if (row.name == name) return row.activation;
    names += (names.empty() ? "" : ", ") + std::string(row.name);
  }
  throw Error(detail::concat("layernorm_mlp: unknown activation '", name, "'; expected one of ", names));
}

bool is_gated(Activation activation) {
  return detail::mlp::activation_row(activation).form.gate != ActivationGate::none;
}

}  // namespace tapegrad

// Helpers for the nn module tests: parameter values in double, random parameters, gradcheck (and gradgradcheck) of a
// module with respect to its input and every parameter, and double references of the norm and the projection, written
// out as loops so that they share no code with the modules.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <string_view>
#include <vector>

#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

namespace tapegrad::test {

// The value of parameter `path` of `module` in double; an undefined tensor when there is none.
inline Tensor<double> parameter_value(const nn::Module& module, std::string_view path) {
  for (const nn::NamedParameter& p : module.parameters()) {
    if (p.path == path) return std::visit([](const auto& v) { return cast<double>(v.value()); }, p.var);
  }
  return {};
}

// Gives every parameter fresh N(0.3, stddev²) values (a norm's ones and a bias's zeros would hide mistakes).
template <class M> void randomize_parameters(M& module, std::uint64_t seed, double stddev = 1.0) {
  for (const nn::NamedParameter& p : module.parameters()) {
    std::visit(
        [&](const auto& v) {
          using P = typename std::remove_cvref_t<decltype(v.value())>::value_type;
          module.set_parameter(p.path, param(randn<P>(v.shape(), seed++, 0.3, stddev)));
        },
        p.var);
  }
}

using Checker = GradcheckResult (*)(const GradcheckFunction&, const std::vector<Tensor<double>>&,
                                    const GradcheckOptions&);

// gradcheck (or `check`: gradgradcheck) of call(module, x) with respect to x and every parameter of a double module;
// the module keeps its own parameters afterwards.
template <class M, class Call>
GradcheckResult module_gradcheck(M& module, const Tensor<double>& x, Call call, const GradcheckOptions& options = {},
                                 Checker check = gradcheck) {
  const nn::ParameterList parameters = module.parameters();
  std::vector<Tensor<double>> inputs{x};
  for (const nn::NamedParameter& p : parameters) inputs.push_back(std::get<Var<double>>(p.var).value());
  GradcheckResult result = check(
      [&](const std::vector<Var<double>>& v) {
        for (std::size_t i = 0; i < parameters.size(); ++i) module.set_parameter(parameters[i].path, v[i + 1]);
        return call(module, v[0]);
      },
      inputs, options);
  for (const nn::NamedParameter& p : parameters) module.set_parameter(p.path, p.var);
  return result;
}
template <class M> GradcheckResult module_gradcheck(M& module, const Tensor<double>& x, Checker check = gradcheck) {
  return module_gradcheck(
      module, x, [](const M& m, const Var<double>& input) { return m(input); }, {}, check);
}

// The norm over the last axis: (x - mean)/sqrt(var + eps)·g (+ bias), g = scale or 1 + scale; rmsnorm: mean = 0.
inline Tensor<double> reference_norm(const Tensor<double>& x, const Tensor<double>& scale, const Tensor<double>& bias,
                                     const nn::LayerNormConfig& config) {
  const std::int64_t H = x.dim(-1), rows = x.numel() / H;
  Tensor<double> y(x.shape());
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean = 0.0, variance = 0.0;
    if (config.norm_type == NormType::layernorm) {
      for (std::int64_t j = 0; j < H; ++j) mean += x.flat(r * H + j) / double(H);
    }
    for (std::int64_t j = 0; j < H; ++j) variance += std::pow(x.flat(r * H + j) - mean, 2) / double(H);
    for (std::int64_t j = 0; j < H; ++j) {
      const double g = scale.flat(j) + (config.zero_centered_gamma ? 1.0 : 0.0);
      const double shift = bias.defined() ? bias.flat(j) : 0.0;
      y.flat(r * H + j) = (x.flat(r * H + j) - mean) / std::sqrt(variance + config.epsilon) * g + shift;
    }
  }
  return y;
}

// x [..., in] · kernel [in, F] (+ bias [F]).
inline Tensor<double> reference_dense(const Tensor<double>& x, const Tensor<double>& kernel,
                                      const Tensor<double>& bias) {
  const std::int64_t in = kernel.dim(0), F = kernel.dim(1), rows = x.numel() / in;
  std::vector<std::int64_t> dims = x.shape().to_vector();
  dims.back() = F;
  Tensor<double> y{Shape(dims)};
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t f = 0; f < F; ++f) {
      double acc = bias.defined() ? bias.flat(f) : 0.0;
      for (std::int64_t i = 0; i < in; ++i) acc += x.flat(r * in + i) * kernel(i, f);
      y.flat(r * F + f) = acc;
    }
  }
  return y;
}

// The module's own norm then projection, from its parameters `<prefix>scale`, `<prefix>kernel`, ...
inline Tensor<double> reference_norm_dense(const nn::Module& m, const std::string& prefix, const Tensor<double>& x,
                                           const nn::LayerNormConfig& config = {}) {
  const Tensor<double> h =
      reference_norm(x, parameter_value(m, prefix + "scale"), parameter_value(m, prefix + "ln_bias"), config);
  return reference_dense(h, parameter_value(m, prefix + "kernel"), parameter_value(m, prefix + "bias"));
}

}  // namespace tapegrad::test

// The cases of the layernorm_mlp tests: every activation and recompute policy, fresh random parameters for a case,
// the node and its composite on them, a loss that weighs every output, and a loop over every option.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tapegrad/tapegrad.hpp"

namespace tapegrad::mlp_test {

inline constexpr Activation all_activations[] = {
    Activation::relu,   Activation::gelu,   Activation::silu,  Activation::quick_gelu,
    Activation::squared_relu, Activation::reglu, Activation::geglu, Activation::swiglu,
    Activation::glu,    Activation::qgeglu, Activation::sreglu, Activation::clamped_swiglu,
};
inline constexpr Recompute all_policies[] = {Recompute::save_all, Recompute::recompute_norm, Recompute::recompute_all};

// The block's parameters; beta, b1 and b2 are undefined when absent.
template <class P> struct Params {
  Var<P> gamma, beta, w1, b1, w2, b2;
  MLPKernels<P> kernels() const { return {w1, w2}; }
  MLPBiases<P> biases() const { return {b1, b2}; }
};

struct Case {
  LayerNormMLPOptions options;
  bool biases = true;
  bool has_beta() const { return options.norm == NormType::layernorm && biases; }
};

// Fresh random parameters in P for x's hidden size H and ffn size F; the scales keep z in the activations' curved
// range.
template <class P> Params<P> make_params(const Case& c, std::int64_t H, std::int64_t F, std::uint64_t seed) {
  const std::int64_t n = activation_width(c.options.activation);
  Params<P> p;
  p.gamma = param(randn<P>({H}, seed, c.options.zero_centered_gamma ? 0.0 : 1.0, 0.3));
  if (c.has_beta()) p.beta = param(randn<P>({H}, seed + 1, 0.0, 0.3));
  p.w1 = param(randn<P>({H, n, F}, seed + 2, 0.0, 1.0 / std::sqrt(double(H))));
  p.w2 = param(randn<P>({F, H}, seed + 3, 0.0, 1.0 / std::sqrt(double(F))));
  if (c.biases) {
    p.b1 = param(randn<P>({n, F}, seed + 4, 0.0, 0.3));
    p.b2 = param(randn<P>({H}, seed + 5, 0.0, 0.3));
  }
  return p;
}

// p's values in U on `device`, as new leaves.
template <class U, class From>
Params<U> params_in(const Params<From>& p, Device device = Device::cpu()) {
  const auto in_u = [&](const Var<From>& v) { return v.defined() ? param(cast<U>(v.value()).to(device)) : Var<U>(); };
  return {in_u(p.gamma), in_u(p.beta), in_u(p.w1), in_u(p.b1), in_u(p.w2), in_u(p.b2)};
}

template <class T> LayerNormMLPOutput<T> composite(const Var<T>& x, const Params<T>& p, const LayerNormMLPOptions& o) {
  return layernorm_mlp_composite(x, p.gamma, p.beta, p.kernels(), p.biases(), o);
}

template <class T, class P> LayerNormMLPOutput<T> node(const Var<T>& x, const Params<P>& p, const LayerNormMLPOptions& o) {
  return layernorm_mlp(x, p.gamma, p.beta, p.kernels(), p.biases(), o);
}

// A scalar that weighs every output element differently, so that backward sees a dense random seed.
// On y's device, with the same weights on every device.
template <class T> Var<T> weighted_loss(const LayerNormMLPOutput<T>& out, std::uint64_t seed) {
  const auto weighted = [&](const Var<T>& v, std::uint64_t s) {
    return sum(v * constant(randn<T>(v.shape(), s).to(v.device())));
  };
  Var<T> loss = weighted(out.y, seed);
  if (out.layernorm_output.defined()) loss = loss + weighted(out.layernorm_output, seed + 1);
  return loss;
}

template <class P> std::vector<Var<P>> defined_params(const Params<P>& p) {
  std::vector<Var<P>> all;
  for (const Var<P>& v : {p.gamma, p.beta, p.w1, p.b1, p.w2, p.b2}) {
    if (v.defined()) all.push_back(v);
  }
  return all;
}

// The parameters from a gradcheck input list: x first, then the defined parameters in defined_params's order.
template <class P> Params<P> params_from(const Case& c, const std::vector<Var<P>>& in) {
  std::size_t i = 1;
  Params<P> p;
  p.gamma = in[i++];
  if (c.has_beta()) p.beta = in[i++];
  p.w1 = in[i++];
  if (c.biases) p.b1 = in[i++];
  p.w2 = in[i++];
  if (c.biases) p.b2 = in[i++];
  return p;
}

// x's values, then the defined parameters', as params_from reads them.
template <class P> std::vector<Tensor<P>> values_of(const Tensor<P>& x, const Params<P>& p) {
  std::vector<Tensor<P>> values{x};
  for (const Var<P>& v : defined_params(p)) values.push_back(v.value());
  return values;
}

inline std::string describe(const Case& c) {
  const auto& o = c.options;
  return std::string(activation_name(o.activation)) + (o.norm == NormType::rmsnorm ? " rmsnorm" : " layernorm") +
         (o.zero_centered_gamma ? " zero-centered" : "") + (c.biases ? " biases" : " no biases") + " " +
         std::string(recompute_name(o.recompute)) + (o.return_layernorm_output ? " returning h" : "") +
         (o.residual ? " residual" : "");
}

// Calls body(case) for every activation × norm × zero-centered γ × biases × recompute policy; half of them with the
// residual (with and without biases, in every policy).
template <class Body> void for_each_case(Body body) {
  for (Activation act : all_activations) {
    for (NormType norm : {NormType::layernorm, NormType::rmsnorm}) {
      for (bool zero_centered : {false, true}) {
        for (bool biases : {true, false}) {
          for (Recompute policy : all_policies) {
            Case c{.options = {.norm = norm, .zero_centered_gamma = zero_centered, .activation = act,
                               .residual = biases != zero_centered, .recompute = policy},
                   .biases = biases};
            const std::string what = describe(c);
            CAPTURE(what);
            body(c);
          }
        }
      }
    }
  }
}

}  // namespace tapegrad::mlp_test

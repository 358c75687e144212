// What the fp8 layernorm_mlp tests share (tests/test_layernorm_mlp_fp8.cpp on the CPU, tests/
// test_gpu_layernorm_mlp_fp8.cpp on a GPU): the recipes they run, one training step of the node on x's device with
// its results on the host, the check that every recompute policy and a second run give the same bits, and the
// quantization written out by hand in double.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "mlp_cases.hpp"
#include "support.hpp"

namespace tapegrad::mlp_test {

struct NamedRecipe {
  std::string name;
  fp8::Recipe recipe;
};
inline const std::vector<NamedRecipe> fp8_recipes{
    {"delayed", fp8::DelayedScaling{.amax_history_len = 4}},
    {"delayed most_recent e4m3", fp8::DelayedScaling{.margin = 1, .format = fp8::Formats::e4m3,
                                                     .amax_history_len = 2,
                                                     .amax_compute = fp8::AmaxCompute::most_recent}},
    {"current", fp8::CurrentScaling{}},
    {"block", fp8::BlockScaling{}},
};

template <class T, class P> struct Step {
  Tensor<T> y;
  std::vector<Tensor<P>> grads;  // x's, then each defined parameter's; on the host
};

// One forward and backward of the node through weighted_loss on x's device; the gradients are taken (to the host)
// and cleared.
template <class T, class P>
Step<T, P> step(const Tensor<T>& xv, const Params<P>& p, const LayerNormMLPOptions& o, std::uint64_t seed) {
  const Device host = Device::cpu();
  const Var<T> x = param(xv);
  const auto out = node(x, p, o);
  backward(weighted_loss(out, seed));
  Step<T, P> s{out.y.value().to(host), {cast<P>(x.grad()).to(host)}};
  for (auto v : defined_params(p)) {
    s.grads.push_back(v.grad().to(host));
    v.zero_grad();
  }
  return s;
}

// The node's steps on x (on its device) with parameters p under every policy, twice each, each with a fresh state
// (the same scales): bitwise the same y and gradients.
template <class T> void check_bitwise_across_policies(const Tensor<T>& x, const Params<T>& p, const Case& c,
                                                     const NamedRecipe& r, std::uint64_t seed) {
  std::vector<Step<T, T>> runs;
  for (Recompute policy : all_policies) {
    for (int run = 0; run < 2; ++run) {
      LayerNormMLPOptions o = c.options;
      o.recompute = policy;
      o.fp8 = fp8_quantization(r.recipe);
      runs.push_back(step(x, p, o, seed));
    }
  }
  for (const auto& other : runs) {
    CHECK(test::bitwise_equal(other.y, runs.front().y));
    for (std::size_t i = 0; i < other.grads.size(); ++i) {
      CHECK(test::bitwise_equal(other.grads[i], runs.front().grads[i]));
    }
  }
}

// fp8(v · scale) · (1 / scale), the product's view of one quantized value, written out from the format's functions.
inline double quantize(double v, fp8::Format format, float scale) {
  const float scaled = static_cast<float>(v) * scale;
  const std::uint8_t bits = format == fp8::Format::e4m3 ? fp8::from_double<fp8::Format::e4m3>(scaled)
                                                        : fp8::from_double<fp8::Format::e5m2>(scaled);
  const float value = format == fp8::Format::e4m3 ? fp8::to_float<fp8::Format::e4m3>(bits)
                                                  : fp8::to_float<fp8::Format::e5m2>(bits);
  return static_cast<double>(value * (1.0f / scale));
}

inline double amax(const Tensor<double>& t) {
  double m = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(t.flat(i)));
  return m;
}

// t [rows, cols] quantized with current scaling.
inline Tensor<double> current_quantized(const Tensor<double>& t, fp8::Format format) {
  const float scale = fp8::current_scale(static_cast<float>(amax(t)), fp8::max_value(format));
  Tensor<double> out(t.shape());
  for (std::int64_t i = 0; i < t.numel(); ++i) out.flat(i) = quantize(t.flat(i), format, scale);
  return out;
}

}  // namespace tapegrad::mlp_test

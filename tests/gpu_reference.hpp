// The GPU suite's one comparison: an op run on the GPU in T against the same op run on the CPU in double.
//
//   check_against_cpu<T>("x * exp(y)", [](const auto& v) { return eval(v[0] * exp(v[1])); },
//                        {{{5, 7}}, {{5, 7}, Inputs::positive}}, tolerance<T>(), seed);
//
// Inputs are drawn fresh in T on the host (normal, or |normal| + 0.5 where an op needs positive values), so both
// runs see exactly the same values; the CPU run widens them to double. The output gradient dy is drawn the same
// way. Compared: the forward value, then the gradient of every input (the GPU's `backward(y, dy)` against the
// double reference's), each within |got - want| <= atol + rtol·|want|.
#pragma once

// The dtypes a GPU op test runs, as a TEST_CASE_TEMPLATE type list: tests/meson.build builds one executable per
// dtype; compiled by hand, a test covers all four.
#ifndef TAPEGRAD_GPU_DTYPES
#define TAPEGRAD_GPU_DTYPES float, double, tapegrad::bf16, tapegrad::f16
#endif

#include <cstdint>
#include <string>
#include <vector>

#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

namespace tapegrad::test {

inline const Device gpu = Device::cuda(0);

struct GpuInput {
  enum Kind { normal, positive } kind = normal;
  Shape shape;
  bool requires_grad = true;
  GpuInput(Shape s, Kind k = normal, bool grad = true) : kind(k), shape(s), requires_grad(grad) {}
};

template <class T> Tensor<T> draw_input(const GpuInput& in, std::uint64_t seed) {
  Tensor<T> t = randn<T>(in.shape, seed);
  if (in.kind == GpuInput::positive) {
    for (std::int64_t i = 0; i < t.numel(); ++i) t.flat(i) = convert<T>(std::abs(convert<double>(t.flat(i))) + 0.5);
  }
  return t;
}

// For a chain of ops (a module's forward, the attention composite) on N(0, 1) inputs whose outputs and gradients are
// of size 1 to 15: f64 differs in summation order; f32 in its f32 accumulations of rows of a few dozen products;
// bf16 and f16 round every intermediate tensor (2⁻⁸, 2⁻¹¹). The modules run on the cpu in T stay within 0.42 (bf16)
// and 0.12 (f16) of these: a margin of 2 to 8 for the GPU's other summation orders.
template <class T> constexpr Tolerance chain_tolerance{};
template <> constexpr Tolerance chain_tolerance<double>{1e-10, 1e-10};
template <> constexpr Tolerance chain_tolerance<float>{1e-4, 1e-4};
template <> constexpr Tolerance chain_tolerance<bf16>{3e-2, 1e-1};
template <> constexpr Tolerance chain_tolerance<f16>{5e-3, 2e-2};

// The values of a run: forward output and the gradient of each input that requires grad (undefined otherwise).
template <class U> struct Run {
  Tensor<double> y;
  std::vector<Tensor<double>> grads;
};

template <class U, class T, class F>
Run<U> run_op(F&& f, const std::vector<GpuInput>& inputs, const std::vector<Tensor<T>>& values,
              const Tensor<T>* dy_values, Device device, std::uint64_t dy_seed) {
  std::vector<Var<U>> vars;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const Tensor<U> v = cast<U>(values[k]).to(device);
    vars.push_back(inputs[k].requires_grad ? param(v) : constant(v));
  }
  Var<U> y = f(vars);
  Run<U> run;
  run.y = cast<double>(y.value().to(Device::cpu()));
  const bool any_grad = y.requires_grad();
  if (any_grad) {
    const Tensor<T> dy = dy_values ? *dy_values : randn<T>(y.shape(), dy_seed);
    backward(y, cast<U>(dy).to(device));
  }
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    run.grads.push_back(inputs[k].requires_grad && any_grad ? cast<double>(vars[k].grad().to(Device::cpu()))
                                                            : Tensor<double>());
  }
  return run;
}

// Runs f on the GPU in T and on the CPU in double, both on the given input values; checks the output and every
// input gradient. Returns the GPU run (for further checks, e.g. of dtype or determinism).
template <class T, class F>
Run<T> check_values_against_cpu(const std::string& what, F&& f, const std::vector<GpuInput>& inputs,
                                const std::vector<Tensor<T>>& values, Tolerance tol, std::uint64_t seed) {
  INFO(what, " in ", dtype_name(dtype_v<T>));
  const std::uint64_t dy_seed = seed + 7777;
  const Run<double> want = run_op<double, T>(f, inputs, values, nullptr, Device::cpu(), dy_seed);
  const Run<T> got = run_op<T, T>(f, inputs, values, nullptr, gpu, dy_seed);
  {
    INFO("forward value");
    check_close(got.y, want.y, tol);
  }
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (!want.grads[k].defined()) continue;
    INFO("gradient of input ", k);
    check_close(got.grads[k], want.grads[k], tol);
  }
  return got;
}

// The same on inputs drawn as `inputs` says.
template <class T, class F>
Run<T> check_against_cpu(const std::string& what, F&& f, const std::vector<GpuInput>& inputs, Tolerance tol,
                         std::uint64_t seed) {
  std::vector<Tensor<T>> values;
  for (std::size_t k = 0; k < inputs.size(); ++k) values.push_back(draw_input<T>(inputs[k], seed + 101 * k));
  return check_values_against_cpu<T>(what, std::forward<F>(f), inputs, values, tol, seed);
}

}  // namespace tapegrad::test

// Modules on the GPU: parameters created directly on the device (in the dtype asked for, issue 3's regression, and
// equal to the cpu-created ones: bitwise for constant and uniform initializers, within the documented bound for
// normal ones), Module::to, and forward and backward of LayerNorm, Dense and LayerNormMLP on
// the GPU against the cpu in double (tests/gpu_reference.hpp). The forward tests need the GPU paths of matmul, the norms, softmax,
// layout and elementwise ops.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "project_attend.hpp"
#include "gpu_random_checks.hpp"
#include "gpu_reference.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::bitwise_equal;
using test::check_against_cpu;
using test::GpuInput;
using test::gpu;
using test::Tolerance;

namespace {

const Device host = Device::cpu();
const nn::MultiHeadAttentionConfig attention{.num_heads = 8, .head_dim = 128, .causal = true};

template <class P> const Tensor<P>& value_of(const nn::NamedParameter& p) { return std::get<Var<P>>(p.var).value(); }

// The dtype of a Var (of the vector the GPU comparison passes to a module's forward).
template <class V> using dtype_of_var = typename std::remove_cvref_t<decltype(std::declval<V>().value())>::value_type;

// A module of compute dtype U built inside a GPU comparison: its own parameters are replaced by the inputs given,
// which check_against_cpu draws identically for both runs.
template <class M, class U> M& with_parameters(M& module, const std::vector<Var<U>>& v,
                                                const std::vector<std::string>& paths) {
  for (std::size_t k = 0; k < paths.size(); ++k) module.set_parameter(paths[k], v[k + 1]);
  return module;
}

// A module's forward and backward in T against the double reference (the MLP's kernels scaled down by powers of two,
// see below): tests/gpu_reference.hpp's tolerance for chains of ops.
template <class T> constexpr Tolerance tolerance = test::chain_tolerance<T>;

}  // namespace

TEST_CASE_TEMPLATE("parameters created on the GPU have the dtype asked for and equal the cpu-created ones",
                   P, TAPEGRAD_GPU_DTYPES) {
  // Kernels are lecun_normal (a truncated normal), scales ones and biases zeros.
  const examples::ProjectAttend<P> on_gpu(128, attention, /*seed=*/3, gpu), on_cpu(128, attention, /*seed=*/3);
  CHECK(on_gpu.device() == gpu);
  const nn::ParameterList got = on_gpu.parameters(), want = on_cpu.parameters();
  REQUIRE(got.size() == 10);
  REQUIRE(want.size() == got.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    CAPTURE(got[k].path);
    CHECK(got[k].path == want[k].path);
    CHECK(dtype_name(got[k].dtype()) == dtype_name(dtype_v<P>));
    CHECK(got[k].device() == gpu);
    const Tensor<P> value = value_of<P>(got[k]).to(host);
    if (got[k].path.ends_with("kernel")) {
      test::check_normal_draws(value, value_of<P>(want[k]), 0.0, truncated_normal_ulp_bound);
    } else {
      CHECK(bitwise_equal(value, value_of<P>(want[k])));
    }
  }

  // Uniform initializers give every bit of the cpu's.
  const nn::DenseConfig uniform{.features = 17,
                                .kernel_init = Initializer::glorot_uniform(),
                                .bias_init = Initializer::uniform(-0.1, 0.1)};
  const nn::Dense<P> dense_gpu(33, uniform, 5, gpu), dense_cpu(33, uniform, 5);
  CHECK(bitwise_equal(dense_gpu.kernel().value().to(host), dense_cpu.kernel().value()));
  CHECK(bitwise_equal(dense_gpu.bias().value().to(host), dense_cpu.bias().value()));
}

TEST_CASE("Module::to moves every parameter and its gradient in place, keeping the variables and the registry") {
  examples::ProjectAttend<bf16> model(16, {.num_heads = 2, .head_dim = 4}, 0);
  const nn::ParameterList before = model.parameters();
  std::vector<Tensor<bf16>> values;
  for (const nn::NamedParameter& p : before) {
    values.push_back(value_of<bf16>(p).clone());
    backward(std::get<Var<bf16>>(p.var), ones<bf16>(p.shape()));
  }

  CHECK(&model.to(gpu) == &model);
  CHECK(model.device() == gpu);
  for (const nn::Module::Child& child : model.children()) CHECK(child.module->device() == gpu);
  const nn::ParameterList after = model.parameters();
  REQUIRE(after.size() == before.size());
  for (std::size_t k = 0; k < after.size(); ++k) {
    CAPTURE(after[k].path);
    CHECK(after[k].path == before[k].path);
    const Var<bf16>& moved = std::get<Var<bf16>>(after[k].var);
    CHECK(moved.slot() == std::get<Var<bf16>>(before[k].var).slot());  // the same variable
    CHECK(moved.device() == gpu);
    CHECK(moved.grad().device() == gpu);
    CHECK(bitwise_equal(moved.value().to(host), values[k]));
    CHECK(bitwise_equal(moved.grad().to(host), ones<bf16>(moved.shape())));
  }

  model.to(host);
  CHECK(model.device() == host);
  for (std::size_t k = 0; k < before.size(); ++k) {
    CHECK(before[k].device() == host);
    CHECK(bitwise_equal(value_of<bf16>(before[k]), values[k]));
  }
}

TEST_CASE_TEMPLATE("issue 3 on the GPU: parameters, output and gradients keep the dtypes asked for", P, float, bf16,
                   f16) {
  const examples::ProjectAttend<P> model(128, attention, /*seed=*/3, gpu);
  const Var<P> y = model(constant(randn<P>({8, 16, 128}, 4, 0.0, 1.0, gpu)));
  CHECK(dtype_name(y.dtype()) == dtype_name(dtype_v<P>));
  CHECK(y.device() == gpu);
  CHECK(y.shape() == Shape{8, 16, 128});

  backward(mean(y));
  for (const nn::NamedParameter& p : model.parameters()) {
    CAPTURE(p.path);
    const Tensor<P>& grad = std::get<Var<P>>(p.var).grad();
    REQUIRE(grad.defined());
    CHECK(grad.device() == gpu);
    CHECK(grad.shape() == p.shape());
    const Tensor<P> on_host = grad.to(host);
    CHECK(std::all_of(on_host.span().begin(), on_host.span().end(), [](P g) { return std::isfinite(float(g)); }));
  }

  // The summary shows where each tensor is.
  const nn::ModelSummary summary = nn::summarize(model, randn<P>({8, 16, 128}, 5, 0.0, 1.0, gpu));
  CHECK(summary.parameter_bytes == summary.parameter_count * std::int64_t(sizeof(P)));
  const std::string table = summary.table();
  CHECK(table.find("kernel: " + std::string(dtype_name(dtype_v<P>)) + "[128,3072]@cuda:0") != std::string::npos);
  CHECK(table.find(std::string(dtype_name(dtype_v<P>)) + "[8,16,128]@cuda:0") != std::string::npos);
}

TEST_CASE_TEMPLATE("LayerNorm forward and backward on the GPU match the cpu in double", T, TAPEGRAD_GPU_DTYPES) {
  for (const NormType norm : {NormType::layernorm, NormType::rmsnorm}) {
    CAPTURE(norm == NormType::layernorm);
    const nn::LayerNormConfig config{.norm_type = norm};
    const std::vector<std::string> paths =
        norm == NormType::layernorm ? std::vector<std::string>{"scale", "ln_bias"} : std::vector<std::string>{"scale"};
    std::vector<GpuInput> inputs{{{2, 7, 33}}, {{33}}};
    if (norm == NormType::layernorm) inputs.push_back({{33}});
    check_against_cpu<T>(
        "LayerNorm",
        [&](const auto& v) {
          using U = dtype_of_var<decltype(v[0])>;
          nn::LayerNorm<U> module(33, config, 0, v[0].device());
          return with_parameters(module, v, paths)(v[0]);
        },
        inputs, tolerance<T>, 1);
  }
}

TEST_CASE_TEMPLATE("Dense forward and backward on the GPU match the cpu in double", T, TAPEGRAD_GPU_DTYPES) {
  for (const bool use_bias : {true, false}) {
    CAPTURE(use_bias);
    const std::vector<std::string> paths =
        use_bias ? std::vector<std::string>{"kernel", "bias"} : std::vector<std::string>{"kernel"};
    std::vector<GpuInput> inputs{{{2, 5, 33}}, {{33, 17}}};
    if (use_bias) inputs.push_back({{17}});
    check_against_cpu<T>(
        "Dense",
        [&](const auto& v) {
          using U = dtype_of_var<decltype(v[0])>;
          nn::Dense<U> module(33, {.features = 17, .use_bias = use_bias}, 0, v[0].device());
          return with_parameters(module, v, paths)(v[0]);
        },
        inputs, tolerance<T>, 2);
  }
}

TEST_CASE_TEMPLATE("LayerNormMLP forward and backward on the GPU match the cpu in double",
                   T, TAPEGRAD_GPU_DTYPES) {
  constexpr std::int64_t H = 33, F = 20;
  const std::vector<std::string> paths{"scale", "ln_bias", "wi_kernel", "wi_bias", "wo_kernel", "wo_bias"};
  for (const Activation activation : {Activation::gelu, Activation::swiglu}) {
    CAPTURE(activation_width(activation));
    const std::int64_t n = activation_width(activation);
    const nn::LayerNormMLPConfig config{.intermediate_dim = F, .activation = activation};
    check_against_cpu<T>(
        "LayerNormMLP",
        [&](const auto& v) {
          using U = dtype_of_var<decltype(v[0])>;
          nn::LayerNormMLP<U> module(H, config, 0, v[0].device());
          // N(0, 1) kernels scaled by about 1/sqrt(fan_in), exactly (powers of two), keep the activations of order 1
          // (unscaled, swiglu's products reach 700, where bf16's rounding of a sum near zero is all there is).
          std::vector<Var<U>> scaled = v;
          scaled[3] = eval(v[3] * 0.125);
          scaled[5] = eval(v[5] * 0.25);
          return with_parameters(module, scaled, paths)(v[0]);
        },
        {{{7, H}}, {{H}}, {{H}}, {{H, n, F}}, {{n, F}}, {{F, H}}, {{H}}}, tolerance<T>, 3);
  }
}

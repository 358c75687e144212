// Elementwise expressions on the GPU: every op and activation, fused expressions and broadcasting, forward and
// gradients, against the CPU in double (tests/gpu_reference.hpp).
//
// Tolerances (rtol, atol), by dtype, for one elementwise op or a short fused expression computed in the compute
// type and rounded once: f64 1e-12 (libm vs CUDA's math library: a few ulp), f32 1e-5 (CUDA's expf/erff/tanhf are
// within 2-4 ulp, and a gradient chains 2-3 of them), bf16 1.6e-2 and f16 2e-3 (one rounding of the result, 2^-8
// and 2^-11, plus the f32 error, and for gradients a second rounded factor such as a rounded input). For bf16/f16
// the same bound is absolute too: the inputs are O(1), and where terms of that size cancel (x·x + x's gradient
// 2x + 1, or a gradient accumulated from two nodes, each rounded) the result keeps their rounding error, not its own.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "tapegrad/cuda/elementwise.hpp"
#include "gpu_reference.hpp"

using namespace tapegrad;
using test::check_against_cpu;
using test::GpuInput;
using test::Tolerance;

namespace {

template <class T> Tolerance tolerance() {
  if constexpr (std::is_same_v<T, double>) return {1e-12, 1e-12};
  if constexpr (std::is_same_v<T, float>) return {1e-5, 1e-6};
  if constexpr (std::is_same_v<T, bf16>) return {1.6e-2, 1.6e-2};
  return {2e-3, 2e-3};
}

const std::vector<std::int64_t> sizes = {0, 1, 7, 33, 1000003};

}  // namespace

TEST_CASE_TEMPLATE("binary operators match the CPU at sizes that are not multiples of the vector width",
                   T, TAPEGRAD_GPU_DTYPES) {
  for (const std::int64_t n : sizes) {
    CAPTURE(n);
    const std::uint64_t seed = 100 + static_cast<std::uint64_t>(n);
    const std::vector<GpuInput> two{{{n}}, {{n}}};
    check_against_cpu<T>("a + b", [](const auto& v) { return eval(v[0] + v[1]); }, two, tolerance<T>(), seed);
    check_against_cpu<T>("a - b", [](const auto& v) { return eval(v[0] - v[1]); }, two, tolerance<T>(), seed);
    check_against_cpu<T>("a * b", [](const auto& v) { return eval(v[0] * v[1]); }, two, tolerance<T>(), seed);
    check_against_cpu<T>("a / b", [](const auto& v) { return eval(v[0] / v[1]); },
                         {{{n}}, {{n}, GpuInput::positive}}, tolerance<T>(), seed);
    check_against_cpu<T>("pow(a, b)", [](const auto& v) { return eval(pow(v[0], v[1])); },
                         {{{n}, GpuInput::positive}, {{n}}}, tolerance<T>(), seed);
  }
}

TEST_CASE_TEMPLATE("unary functions and activations match the CPU", T, TAPEGRAD_GPU_DTYPES) {
  const Shape s{3, 37};
  const Tolerance tol = tolerance<T>();
  const GpuInput any{s}, positive{s, GpuInput::positive};
  check_against_cpu<T>("-x", [](const auto& v) { return eval(-v[0]); }, {any}, tol, 1);
  check_against_cpu<T>("exp", [](const auto& v) { return eval(exp(v[0])); }, {any}, tol, 2);
  check_against_cpu<T>("log", [](const auto& v) { return eval(log(v[0])); }, {positive}, tol, 3);
  check_against_cpu<T>("sqrt", [](const auto& v) { return eval(sqrt(v[0])); }, {positive}, tol, 4);
  check_against_cpu<T>("rsqrt", [](const auto& v) { return eval(rsqrt(v[0])); }, {positive}, tol, 5);
  check_against_cpu<T>("square", [](const auto& v) { return eval(square(v[0])); }, {any}, tol, 6);
  check_against_cpu<T>("abs", [](const auto& v) { return eval(abs(v[0])); }, {any}, tol, 7);
  check_against_cpu<T>("tanh", [](const auto& v) { return eval(tanh(v[0])); }, {any}, tol, 8);
  check_against_cpu<T>("sigmoid", [](const auto& v) { return eval(sigmoid(v[0])); }, {any}, tol, 9);
  check_against_cpu<T>("relu", [](const auto& v) { return eval(relu(v[0])); }, {any}, tol, 10);
  check_against_cpu<T>("gelu", [](const auto& v) { return eval(gelu(v[0])); }, {any}, tol, 11);
  check_against_cpu<T>("gelu_tanh", [](const auto& v) { return eval(gelu_tanh(v[0])); }, {any}, tol, 12);
  check_against_cpu<T>("silu", [](const auto& v) { return eval(silu(v[0])); }, {any}, tol, 13);
  check_against_cpu<T>("quick_gelu", [](const auto& v) { return eval(quick_gelu(v[0])); }, {any}, tol, 14);
  check_against_cpu<T>("squared_relu", [](const auto& v) { return eval(squared_relu(v[0])); }, {any}, tol, 15);
}

TEST_CASE_TEMPLATE("scalar operands match the CPU", T, TAPEGRAD_GPU_DTYPES) {
  const GpuInput any{{5, 9}}, positive{{5, 9}, GpuInput::positive};
  const Tolerance tol = tolerance<T>();
  check_against_cpu<T>("x + 1.5", [](const auto& v) { return eval(v[0] + 1.5); }, {any}, tol, 1);
  check_against_cpu<T>("2 - x", [](const auto& v) { return eval(2.0 - v[0]); }, {any}, tol, 2);
  check_against_cpu<T>("x * 3", [](const auto& v) { return eval(v[0] * 3); }, {any}, tol, 3);
  check_against_cpu<T>("x / 4", [](const auto& v) { return eval(v[0] / 4.0); }, {any}, tol, 4);
  check_against_cpu<T>("2 / x", [](const auto& v) { return eval(2.0 / v[0]); }, {positive}, tol, 5);
  check_against_cpu<T>("x ^ 1.7", [](const auto& v) { return eval(pow(v[0], 1.7)); }, {positive}, tol, 6);
}

TEST_CASE_TEMPLATE("a fused expression is one node on the GPU and matches the CPU", T, TAPEGRAD_GPU_DTYPES) {
  // Rounding each input once in bf16/f16 moves this longer expression's terms by up to 3 roundings.
  Tolerance tol = tolerance<T>();
  if constexpr (is_half_precision_v<T>) tol.rtol *= 2;
  const auto f = [](const auto& v) { return eval(v[0] * exp(-square(v[1])) + tanh(v[2]) / (1.0 + abs(v[0]))); };
  check_against_cpu<T>("fused", f, {{{1000}}, {{1000}}, {{1000}}}, tol, 21);
  Tape::active().clear();
  Var<T> a = param(randn<T>({64}, 1).to(test::gpu)), b = param(randn<T>({64}, 2).to(test::gpu));
  Var<T> y = a * exp(b) + a;
  CHECK(Tape::active().size() == 1);
  CHECK(y.device() == test::gpu);
}

TEST_CASE_TEMPLATE("broadcasting matches the CPU, and broadcast operands get summed gradients",
                   T, TAPEGRAD_GPU_DTYPES) {
  // A broadcast operand's gradient sums up to 100 terms: the rounding of the sum adds to the per-element error.
  Tolerance tol = tolerance<T>();
  if constexpr (std::is_same_v<T, float>) tol.rtol = 1e-4;
  const auto mul = [](const auto& v) { return eval(v[0] * v[1]); };
  const auto affine = [](const auto& v) { return eval(v[0] * v[1] + v[2]); };
  check_against_cpu<T>("row vector", mul, {{{100, 33}}, {{33}}}, tol, 1);
  check_against_cpu<T>("column", mul, {{{100, 33}}, {{100, 1}}}, tol, 2);
  check_against_cpu<T>("outer", mul, {{{100, 1}}, {{1, 33}}}, tol, 3);
  check_against_cpu<T>("scalar tensor", mul, {{{7, 5, 3}}, {Shape{}}}, tol, 4);
  check_against_cpu<T>("middle axis", mul, {{{4, 5, 6}}, {{4, 1, 6}}}, tol, 5);
  check_against_cpu<T>("rank 5", mul, {{{2, 3, 1, 5, 2}}, {{3, 4, 1, 1}}}, tol, 6);
  check_against_cpu<T>("bias and scale", affine, {{{64, 48}}, {{48}}, {{64, 1}}}, tol, 7);
  check_against_cpu<T>("empty", mul, {{{0, 33}}, {{33}}}, tol, 8);
  // About a million elements in rows a multiple of 8 long: every thread of the staged kernel walks several groups
  // with its copies running ahead, a bias staged and a column read at its instruction. The broadcast gradients
  // sum 125 to 2000 terms, whose rounding near a cancelling sum needs a wider atol.
  Tolerance large = tol;
  large.atol *= 20;
  check_against_cpu<T>("bias and scale, large", affine, {{{2000, 520}}, {{520}}, {{2000, 1}}}, large, 9);
  check_against_cpu<T>("middle axis, large", mul, {{{16, 125, 512}}, {{16, 1, 512}}}, large, 10);
}

TEST_CASE_TEMPLATE("an operand used twice accumulates its gradients on the GPU", T, TAPEGRAD_GPU_DTYPES) {
  Tolerance tol = tolerance<T>();
  check_against_cpu<T>("x * x + x", [](const auto& v) { return eval(v[0] * v[0] + v[0]); }, {{{1001}}}, tol, 3);
  check_against_cpu<T>("two nodes", [](const auto& v) { return eval(exp(v[0]) * v[1]) + v[0] * 2; },
                       {{{77}}, {{77}}}, tol, 4);
}

TEST_CASE_TEMPLATE("an add's operands made by ops share its gradient, and every gradient is still right", T,
                   TAPEGRAD_GPU_DTYPES) {
  // y + square(y) hands dy itself to y and to square(y), which adds its own into y's (a copy on write); y = a + b
  // hands y's gradient to a and b, whose nodes read it as their dy.
  Tolerance tol = tolerance<T>();
  if constexpr (is_half_precision_v<T>) tol.rtol *= 2;
  const auto residuals = [](const auto& v) {
    const auto a = eval(tanh(v[0]) * v[1]);
    const auto b = eval(v[0] * 0.5);
    const auto y = eval(a + b);
    return eval(y + eval(square(y)));
  };
  check_against_cpu<T>("residual adds", residuals, {{{1001}}, {{1001}}}, tol, 5);
}

TEST_CASE("operands without a gradient are left alone; constants need none") {
  Var<float> x = param(randn<float>({9}, 1).to(test::gpu));
  Var<float> c = constant(randn<float>({9}, 2).to(test::gpu));
  Var<float> y = x * c;
  backward(y, ones<float>({9}, test::gpu));
  const Tensor<float> g = x.grad().to(Device::cpu()), want = c.value().to(Device::cpu());
  CHECK(test::bitwise_equal(g, want));
  CHECK(!c.grad().defined());
}

namespace {
// exp applied `Depth` times in ONE expression.
template <int Depth, class X> auto nested_exp(const X& x) {
  if constexpr (Depth == 0) {
    return x;
  } else {
    return exp(nested_exp<Depth - 1>(x));
  }
}
}  // namespace

TEST_CASE("GPU expressions refuse mixed devices and programs they cannot hold, naming them") {
  Var<float> a = param(randn<float>({4}, 1).to(test::gpu)), b = param(randn<float>({4}, 2));
  CHECK_THROWS_WITH_AS((void)eval(a + b), doctest::Contains("add(x0, x1): input 0 is on cuda:0 but input 1 is on cpu"),
                       Error);
  // The gradient of a 20-deep chain repeats the chain below each factor: more than a program holds. Backward says
  // so and what to do; evaluating half of the chain first fits.
  Var<float> small = param(full<float>({4}, -3.0, test::gpu));
  Var<float> y = nested_exp<20>(small);
  CHECK_THROWS_WITH_AS(backward(y, ones<float>({4}, test::gpu)),
                       doctest::Contains("too long for a GPU program (more than 96 instructions"), Error);
  Var<float> half = nested_exp<10>(small);
  Var<float> z = nested_exp<10>(half);
  CHECK_NOTHROW(backward(z, ones<float>({4}, test::gpu)));
}

namespace {

// Sets how elementwise programs run for a scope.
class CompilationMode {
 public:
  explicit CompilationMode(cuda::ElementCompilation mode) : previous_(cuda::element_compilation()) {
    cuda::set_element_compilation(mode);
  }
  ~CompilationMode() { cuda::set_element_compilation(previous_); }
  CompilationMode(const CompilationMode&) = delete;
  CompilationMode& operator=(const CompilationMode&) = delete;

 private:
  cuda::ElementCompilation previous_;
};

// Runs f forward and backward with the interpreting kernel and with kernels made for its programs: same bits.
template <class T, class F> void check_made_kernels(const std::string& what, F&& f, const std::vector<GpuInput>& inputs,
                                                   std::uint64_t seed) {
  INFO(what, " in ", dtype_name(dtype_v<T>));
  std::vector<Tensor<T>> values;
  for (std::size_t k = 0; k < inputs.size(); ++k) values.push_back(test::draw_input<T>(inputs[k], seed + 101 * k));
  const auto run = [&](cuda::ElementCompilation mode) {
    const CompilationMode scope(mode);
    return test::run_op<T, T>(f, inputs, values, nullptr, test::gpu, seed);
  };
  const test::Run<T> interpreted = run(cuda::ElementCompilation::never), made = run(cuda::ElementCompilation::always);
  CHECK(test::bitwise_equal(made.y, interpreted.y));
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    INFO("gradient of input ", k);
    if (interpreted.grads[k].defined()) CHECK(test::bitwise_equal(made.grads[k], interpreted.grads[k]));
  }
}

}  // namespace

TEST_CASE_TEMPLATE("kernels made for each program give the interpreting kernel's bits, forward and backward", T,
                   TAPEGRAD_GPU_DTYPES) {
  // 1003 elements: the made kernel's groups and an interpreted tail; rows of 64 with a bias and a column.
  const GpuInput any{{1003}}, positive{{1003}, GpuInput::positive};
  check_made_kernels<T>("a + b", [](const auto& v) { return eval(v[0] + v[1]); }, {any, any}, 1);
  check_made_kernels<T>("a - b * 3", [](const auto& v) { return eval(v[0] - v[1] * 3.0); }, {any, any}, 2);
  check_made_kernels<T>("a / b", [](const auto& v) { return eval(v[0] / v[1]); }, {any, positive}, 3);
  check_made_kernels<T>("pow(a, b)", [](const auto& v) { return eval(pow(v[0], v[1])); }, {positive, any}, 4);
  check_made_kernels<T>("exp, log, sqrt, rsqrt",
                        [](const auto& v) { return eval(exp(-v[0]) + log(v[0]) * sqrt(v[0]) - rsqrt(v[0])); },
                        {positive}, 5);
  check_made_kernels<T>("square, abs, tanh, sigmoid",
                        [](const auto& v) { return eval(square(v[0]) + abs(v[0]) * tanh(v[0]) - sigmoid(v[0])); },
                        {any}, 6);
  check_made_kernels<T>("relu, gelu, gelu_tanh",
                        [](const auto& v) { return eval(relu(v[0]) + gelu(v[0]) * gelu_tanh(v[0])); }, {any}, 7);
  check_made_kernels<T>("silu, quick_gelu, squared_relu",
                        [](const auto& v) { return eval(silu(v[0]) - quick_gelu(v[0]) + squared_relu(v[0])); }, {any},
                        8);
  check_made_kernels<T>("bias and scale rows", [](const auto& v) { return eval(v[0] * v[1] + v[2]); },
                        {{{40, 64}}, {{64}}, {{40, 1}}}, 9);
}

// fp8_dense on the CPU: its products and gradients written out by hand in double (current scaling); delayed
// scaling's state (the roles it records, the scales of the next step); every recipe in f32, bf16 and with f32
// parameters under bf16, against the unquantized product under bounds on the relative error; bitwise the same on a
// second run; bad arguments refused by name; nn::Dense and nn::LayerNormDense with a recipe are the op with a state
// of their own, their parameters staying in P.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <variant>
#include <vector>

#include "fp8_mlp_cases.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using tapegrad::mlp_test::amax;
using tapegrad::mlp_test::current_quantized;
using tapegrad::mlp_test::fp8_recipes;
using tapegrad::mlp_test::NamedRecipe;

namespace {

// a [M, K] · b [K, N], with either transposed as stored.
Tensor<double> multiply(const Tensor<double>& a, bool ta, const Tensor<double>& b, bool tb, std::int64_t M,
                        std::int64_t K, std::int64_t N) {
  Tensor<double> out = zeros<double>({M, N});
  for (std::int64_t i = 0; i < M; ++i) {
    for (std::int64_t k = 0; k < K; ++k) {
      const double av = ta ? a.flat(k * M + i) : a.flat(i * K + k);
      for (std::int64_t j = 0; j < N; ++j) out.flat(i * N + j) += av * (tb ? b.flat(j * K + k) : b.flat(k * N + j));
    }
  }
  return out;
}

template <class T, class P> struct Run {
  Tensor<T> y;
  std::vector<Tensor<P>> grads;  // x's (in P), the kernel's, the bias's
};
template <class T, class P>
Run<T, P> run(const Tensor<T>& xv, Var<P> kernel, Var<P> bias, const Fp8Quantization& q,
              const Tensor<T>& dy) {
  const Var<T> x = param(xv);
  const Var<T> y = fp8_dense(x, kernel, bias, q);
  backward(sum(y * constant(dy)));
  Run<T, P> r{y.value(), {cast<P>(x.grad()), kernel.grad(), bias.defined() ? bias.grad() : Tensor<P>()}};
  kernel.zero_grad();
  if (bias.defined()) bias.zero_grad();
  return r;
}

}  // namespace

TEST_CASE("fp8_dense multiplies the quantized x, kernel and dy, with current scaling each its own") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  const std::int64_t M = 6, K = 8, N = 12;
  const Tensor<double> xv = randn<double>({2, 3, K}, seed), dy = randn<double>({2, 3, N}, seed + 1);
  const Var<double> kernel = param(randn<double>({K, N}, seed + 2, 0.0, 0.3));
  const Var<double> bias = param(randn<double>({N}, seed + 3));
  const auto got = run(xv, kernel, bias, Fp8Quantization{.recipe = fp8::CurrentScaling{}}, dy);
  using fp8::Format;
  const Tensor<double> x2 = xv.reshape({M, K}), dy2 = dy.reshape({M, N});
  const Tensor<double> xq = current_quantized(x2, Format::e4m3), wq = current_quantized(kernel.value(), Format::e4m3);
  const Tensor<double> dyq = current_quantized(dy2, Format::e5m2);
  Tensor<double> y = multiply(xq, false, wq, false, M, K, N);
  Tensor<double> db = zeros<double>({N});
  for (std::int64_t i = 0; i < M * N; ++i) {
    y.flat(i) += bias.value().flat(i % N);
    db.flat(i % N) += dy2.flat(i);
  }
  test::check_close(got.y, y.reshape({2, 3, N}), {1e-12, 1e-12});
  test::check_close(got.grads[0], multiply(dyq, false, wq, true, M, N, K).reshape({2, 3, K}), {1e-12, 1e-12});
  test::check_close(got.grads[1], multiply(xq, true, dyq, false, K, M, N), {1e-12, 1e-12});
  test::check_close(got.grads[2], db, {1e-12, 1e-12});
}

TEST_CASE("fp8_dense with delayed scaling records x, the kernel and dy, and quantizes the next step with them") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  const Fp8Quantization q = fp8_quantization(fp8::DelayedScaling{.amax_history_len = 3});
  const Tensor<double> xv = randn<double>({5, 16}, seed), dy = randn<double>({5, 24}, seed + 1);
  const Var<double> kernel = param(randn<double>({16, 24}, seed + 2, 0.0, 0.25)), bias;
  run(xv, kernel, bias, q, dy);
  const fp8::ScalingState& state = *q.state;
  CHECK(state.amax_history(fp8::Role::input)[0] == static_cast<float>(amax(xv)));
  CHECK(state.amax_history(fp8::Role::kernel1)[0] == static_cast<float>(amax(kernel.value())));
  CHECK(state.amax_history(fp8::Role::grad_output)[0] == static_cast<float>(amax(dy)));
  for (fp8::Role untouched : {fp8::Role::activation, fp8::Role::kernel2, fp8::Role::grad_hidden}) {
    CHECK(state.amax_history(untouched)[0] == 0.0f);
  }
  run(xv, kernel, bias, q, dy);  // its forward ends the first step
  CHECK(state.steps() == 1);
  CHECK(state.scale(fp8::Role::input) == fp8::delayed_scale(static_cast<float>(amax(xv)), 1.0f, 448.0f, 0));
  CHECK(state.scale(fp8::Role::grad_output) == fp8::delayed_scale(static_cast<float>(amax(dy)), 1.0f, 57344.0f, 0));
  CHECK(state.scale(fp8::Role::kernel2) == 1.0f);
}

TEST_CASE("fp8_dense stays near the unquantized product in every recipe and dtype, bitwise on a second run") {
  // Bounds on ‖got - exact‖ / ‖exact‖ (measured about half of them): y reads two e4m3 operands (up to 2^-4 each,
  // rms ≈ 3.6 %), the gradients an e5m2 one (up to 2^-3) beside an e4m3 one. A wrong operand, transpose or scale
  // gives errors of order 1.
  const double forward_bound = 0.1, gradient_bound = 0.2;
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  const std::int64_t K = 160, N = 136;  // block scaling's tiles and blocks end short
  const Tensor<double> xd = randn<double>({3, 11, K}, seed), dyd = randn<double>({3, 11, N}, seed + 1);
  const Tensor<double> wd = randn<double>({K, N}, seed + 2, 0.0, 1.0 / std::sqrt(double(K)));
  const Tensor<double> bd = randn<double>({N}, seed + 3, 0.0, 0.3);
  Run<double, double> exact;
  {
    const Var<double> x = param(xd), w = param(wd), b = param(bd);
    backward(sum(nn::dense(x, w, b) * constant(dyd)));
    exact = {nn::dense(x, w, b).value(), {x.grad(), w.grad(), b.grad()}};
  }
  const auto check_near = [&](const auto& got) {
    CHECK(test::relative_error(got.y, exact.y) <= forward_bound);
    for (std::size_t i = 0; i < 3; ++i) {
      CAPTURE(i);
      CHECK(test::relative_error(got.grads[i], exact.grads[i]) <= gradient_bound);
    }
  };
  const auto twice = [&](const auto& xv, const auto& w, const auto& b, const NamedRecipe& r, const auto& dy) {
    const auto first = run(xv, w, b, fp8_quantization(r.recipe), dy);
    const auto second = run(xv, w, b, fp8_quantization(r.recipe), dy);
    CHECK(test::bitwise_equal(first.y, second.y));
    for (std::size_t i = 0; i < 3; ++i) CHECK(test::bitwise_equal(first.grads[i], second.grads[i]));
    return first;
  };
  for (const NamedRecipe& r : fp8_recipes) {
    CAPTURE(r.name);
    check_near(twice(xd, param(wd), param(bd), r, dyd));
    check_near(twice(cast<float>(xd), param(cast<float>(wd)), param(cast<float>(bd)), r, cast<float>(dyd)));
    check_near(twice(cast<bf16>(xd), param(cast<bf16>(wd)), param(cast<bf16>(bd)), r, cast<bf16>(dyd)));
    check_near(twice(cast<bf16>(xd), param(cast<float>(wd)), param(cast<float>(bd)), r, cast<bf16>(dyd)));
  }
}

TEST_CASE("fp8_dense refuses arguments that do not fit, naming them") {
  const Var<float> x = param(randn<float>({4, 8}, 1)), w = param(randn<float>({8, 6}, 2));
  const Fp8Quantization current{.recipe = fp8::CurrentScaling{}};
  CHECK_THROWS_WITH_AS(fp8_dense(x, param(randn<float>({7, 6}, 3)), Var<float>(), current),
                       "fp8_dense: kernel has shape [7, 6] but x has shape [4, 8] (a kernel is [K, N] for x [..., K])",
                       Error);
  CHECK_THROWS_WITH_AS(fp8_dense(x, w, param(randn<float>({5}, 3)), current),
                       "fp8_dense: bias has shape [5] but the kernel [8, 6] needs [6]", Error);
  CHECK_THROWS_WITH_AS(fp8_dense(Var<float>(), w, Var<float>(), current),
                       doctest::Contains("fp8_dense: x is undefined"), Error);
  CHECK_THROWS_WITH_AS(fp8_dense(x, w, Var<float>(), Fp8Quantization{.recipe = fp8::DelayedScaling{}}),
                       doctest::Contains("fp8_dense: fp8 delayed scaling needs its state"), Error);
  Tensor<float> bad = randn<float>({4, 8}, 4);
  bad.flat(3) = NAN;
  CHECK_THROWS_WITH_AS(fp8_dense(param(bad), w, Var<float>(), current),
                       doctest::Contains("fp8_dense: fp8: x holds an infinity or a NaN"), Error);
  CHECK_NOTHROW(backward(sum(fp8_dense(x, w, Var<float>(), current))));  // the tape is still usable
}

TEST_CASE("nn::Dense and nn::LayerNormDense with a recipe are fp8_dense with a state they own; parameters stay in P") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  for (const NamedRecipe& r : fp8_recipes) {
    CAPTURE(r.name);
    const nn::Dense<float, bf16> dense(32, {.features = 24, .bias_init = Initializer::normal(0.1), .fp8 = r.recipe},
                                       seed);
    const nn::LayerNormDense<float, bf16> ln_dense(32, {.dense = {.features = 24, .fp8 = r.recipe}}, seed + 1);
    for (const nn::NamedParameter& p : dense.parameters()) CHECK(p.dtype() == DType::f32);
    for (const nn::NamedParameter& p : ln_dense.parameters()) CHECK(p.dtype() == DType::f32);
    const Fp8Quantization own = fp8_quantization(r.recipe), own_ln = fp8_quantization(r.recipe);
    for (int s = 0; s < 3; ++s) {
      CAPTURE(s);
      const Var<float> x = constant(randn<float>({5, 32}, seed + 2 + s));
      CHECK(test::bitwise_equal(dense(x).value(), fp8_dense(cast<bf16>(x), dense.kernel(), dense.bias(), own).value()));
      const auto out = ln_dense.with_layernorm_output(x);
      CHECK(test::bitwise_equal(out.output.value(),
                                fp8_dense(out.layernorm_output, ln_dense.kernel(), ln_dense.bias(), own_ln).value()));
    }
    const bool delayed = std::holds_alternative<fp8::DelayedScaling>(r.recipe);
    CHECK((dense.fp8_state() != nullptr) == delayed);
    CHECK((ln_dense.fp8_state() != nullptr) == delayed);
    if (delayed) CHECK(dense.fp8_state()->steps() == own.state->steps());
    const std::string table = nn::summary(dense, randn<float>({5, 32}, 1));
    CHECK(table.find(fp8::describe(r.recipe)) != std::string::npos);
    CHECK(nn::summary(ln_dense, randn<float>({5, 32}, 1)).find(fp8::describe(r.recipe)) != std::string::npos);
  }
}

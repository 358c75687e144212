// fp8_dense on the GPU against the CPU's fp8_dense (its reference, tests/test_fp8_dense.cpp) on the same inputs:
// every recipe, x in f32 and bf16, f32 parameters under bf16 compute, with and without a bias, sizes that need
// padding (K 24, N 40, 21 rows) and a block of several tiles (K 256, N 384, 300 rows); delayed scaling's state after
// several steps; the weight cache across micro-batches; nn::Dense with a recipe on the GPU.
//
// Both sides quantize the same values (x, the kernel, dy) with the same scales (their amaxes are of the same
// values), so they multiply the same fp8 codes: they differ only in the sums, which the FP8 tensor cores take with
// about 14 bits between promotions to f32 (tests/fp8_sums.hpp), and in bf16 in the output's rounding then. Bounds on
// ‖gpu - cpu‖ / ‖cpu‖: f32 2e-3 and bf16 1.5e-2 (a bf16 rounding is up to 2^-9 of each element); a wrong operand,
// layout, scale or crop gives errors of order 1. The forward's products run without fast accumulation here, and
// again with it on the larger block (bound 2e-2).
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <variant>
#include <vector>

#include "fp8_mlp_cases.hpp"
#include "gpu_reference.hpp"

using namespace tapegrad;
using tapegrad::mlp_test::fp8_recipes;
using tapegrad::mlp_test::NamedRecipe;
using test::gpu;

namespace {

template <class T> double bound() { return std::is_same_v<T, float> ? 2e-3 : 1.5e-2; }

// y and the gradients of x, the kernel and the bias (where there is one), on the host in double.
struct Run {
  std::vector<Tensor<double>> values;
};
template <class T> Tensor<double> host(const Tensor<T>& t) { return cast<double>(t.to(Device::cpu())); }

template <class T, class P>
Run run(const Tensor<T>& xv, const Tensor<P>& wv, const Tensor<P>& bv, const Fp8Quantization& q, const Tensor<T>& dy,
        Device device) {
  const Var<T> x = param(xv.to(device));
  const Var<P> w = param(wv.to(device)), b = bv.defined() ? param(bv.to(device)) : Var<P>();
  const Var<T> y = fp8_dense(x, w, b, q);
  backward(sum(y * constant(dy.to(device))));
  Run r{{host(y.value()), host(x.grad()), host(w.grad())}};
  if (b.defined()) r.values.push_back(host(b.grad()));
  return r;
}

double worst_error(const Run& got, const Run& want) {
  REQUIRE(got.values.size() == want.values.size());
  double worst = 0;
  for (std::size_t i = 0; i < want.values.size(); ++i) {
    worst = std::max(worst, test::relative_error(got.values[i], want.values[i]));
  }
  return worst;
}

// The GPU op against the CPU's on x [rows, K], kernel [K, N], over three steps (delayed scaling's later steps use
// the earlier ones' amaxes); returns the largest relative error.
template <class T, class P>
double compare(std::int64_t rows, std::int64_t K, std::int64_t N, bool with_bias, const NamedRecipe& r,
               std::uint64_t seed, bool fast_accumulation = false) {
  const Tensor<P> w = randn<P>({K, N}, seed, 0.0, 1.0 / std::sqrt(double(K)));
  const Tensor<P> b = with_bias ? randn<P>({N}, seed + 1, 0.0, 0.3) : Tensor<P>();
  const Fp8Quantization cpu_q = fp8_quantization(r.recipe);
  Fp8Quantization gpu_q = fp8_quantization(r.recipe);
  gpu_q.fast_forward_accumulation = fast_accumulation;
  double worst = 0;
  for (int k = 0; k < 3; ++k) {
    CAPTURE(k);
    const Tensor<T> x = randn<T>({rows, K}, seed + 2 + k), dy = randn<T>({rows, N}, seed + 10 + k);
    worst = std::max(worst, worst_error(run(x, w, b, gpu_q, dy, gpu), run(x, w, b, cpu_q, dy, Device::cpu())));
  }
  if (cpu_q.state) {  // the same values recorded: bitwise the same histories and scales
    for (fp8::Role role : fp8::roles) {
      CAPTURE(fp8::role_name(role));
      const auto want = cpu_q.state->amax_history(role), got = gpu_q.state->amax_history(role);
      CHECK(std::equal(want.begin(), want.end(), got.begin(), got.end()));
      CHECK(gpu_q.state->scale(role) == cpu_q.state->scale(role));
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("fp8_dense on the GPU multiplies the CPU's fp8 codes, in every recipe, dtype and size") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  for (const NamedRecipe& r : fp8_recipes) {
    CAPTURE(r.name);
    double f32 = 0, b16 = 0, fast = 0;
    for (bool with_bias : {true, false}) {
      CAPTURE(with_bias);
      f32 = std::max(f32, compare<float, float>(21, 24, 40, with_bias, r, seed));
      f32 = std::max(f32, compare<float, float>(300, 256, 384, with_bias, r, seed + 20));
      b16 = std::max(b16, compare<bf16, bf16>(21, 24, 40, with_bias, r, seed + 40));
      b16 = std::max(b16, compare<bf16, float>(300, 256, 384, with_bias, r, seed + 60));
      fast = std::max(fast, compare<float, float>(300, 256, 384, with_bias, r, seed + 80, true));
    }
    CHECK(f32 <= bound<float>());
    CHECK(b16 <= bound<bf16>());
    CHECK(fast <= 2e-2);
    MESSAGE(r.name, ": largest relative errors: f32 ", f32, ", bf16 ", b16, ", f32 with fast accumulation ", fast);
  }
}

TEST_CASE("fp8_dense on the GPU takes x of any leading shape and gives bitwise the same results on a second run") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  const Tensor<bf16> x = randn<bf16>({2, 5, 3, 48}, seed), dy = randn<bf16>({2, 5, 3, 24}, seed + 1);
  const Tensor<bf16> w = randn<bf16>({48, 24}, seed + 2, 0.0, 0.2), b = randn<bf16>({24}, seed + 3);
  for (const NamedRecipe& r : fp8_recipes) {
    CAPTURE(r.name);
    const Run first = run(x, w, b, fp8_quantization(r.recipe), dy, gpu);
    const Run second = run(x, w, b, fp8_quantization(r.recipe), dy, gpu);
    CHECK(first.values[0].shape() == Shape{2, 5, 3, 24});
    CHECK(first.values[1].shape() == Shape{2, 5, 3, 48});
    for (std::size_t i = 0; i < first.values.size(); ++i) CHECK(test::bitwise_equal(first.values[i], second.values[i]));
  }
}

TEST_CASE("on the GPU a weight cache gives the first micro-batch's products to the next ones, until cleared") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  const Tensor<float> x = randn<float>({32, 64}, seed), dy = randn<float>({32, 48}, seed + 1);
  const Tensor<float> w = randn<float>({64, 48}, seed + 2, 0.0, 0.2);
  for (const NamedRecipe& r : fp8_recipes) {
    CAPTURE(r.name);
    Fp8Quantization cached = fp8_quantization(r.recipe);
    cached.weight_cache = std::make_shared<fp8::WeightCache>();
    const Var<float> kernel = param(w.to(gpu));
    const auto forward = [&](const Fp8Quantization& q) {
      return host(fp8_dense(constant(x.to(gpu)), kernel, Var<float>(), q).value());
    };
    const Tensor<double> first = forward(cached);
    CHECK(cached.weight_cache->copies_made() == 1);
    const Tensor<double> second = forward(cached);
    CHECK(cached.weight_cache->copies_made() == 1);
    if (std::holds_alternative<fp8::CurrentScaling>(r.recipe) || std::holds_alternative<fp8::BlockScaling>(r.recipe)) {
      CHECK(test::bitwise_equal(first, second));  // scales of the same values: the same step twice
    }
    cached.weight_cache->clear();
    forward(cached);
    CHECK(cached.weight_cache->copies_made() == 2);
  }
}

TEST_CASE("nn::Dense with a recipe on the GPU follows the module on the CPU; parameters stay in P") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  for (const NamedRecipe& r : fp8_recipes) {
    CAPTURE(r.name);
    const nn::DenseConfig config{.features = 40, .bias_init = Initializer::normal(0.1), .fp8 = r.recipe};
    nn::Dense<float, bf16> on_gpu(24, config, seed, gpu), on_cpu(24, config, seed);
    for (const nn::NamedParameter& p : on_gpu.parameters()) CHECK(p.dtype() == DType::f32);
    const Tensor<float> x = randn<float>({3, 7, 24}, seed + 1);
    const Tensor<double> got = host(on_gpu(constant(x.to(gpu))).value());
    const Tensor<double> want = host(on_cpu(constant(x)).value());
    CHECK(test::relative_error(got, want) <= 2 * bound<bf16>());  // (the forward's fast accumulation on the GPU)
  }
}

TEST_CASE("fp8_dense on the GPU refuses f64 by name, and the tape stays usable") {
  const Var<double> w = param(randn<double>({16, 8}, 1).to(gpu));
  const Fp8Quantization current = fp8_quantization(fp8::CurrentScaling{});
  CHECK_THROWS_WITH_AS(fp8_dense(param(randn<double>({4, 16}, 2).to(gpu)), w, Var<double>(), current),
                       doctest::Contains("fp8 on a GPU computes in f32, bf16 or f16"), Error);
  const Var<float> x = param(randn<float>({4, 16}, 3).to(gpu));
  backward(sum(fp8_dense(x, param(randn<float>({16, 8}, 4).to(gpu)), Var<float>(), current)));
  CHECK(x.grad().defined());
}

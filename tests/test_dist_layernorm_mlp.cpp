// layernorm_mlp under tensor parallelism (and with sequence parallelism) over 1, 2 and 4 ranks, against the
// unsharded node on the whole block: y and every gradient, for both norms × a plain and a gated activation ×
// biases × recompute policies × returning h, in f64 and f32; with fp8, every recipe, and a rank's bad shard refused on
// every rank. Also the differentiable collectives of ops/dist.hpp in a hand-sharded MLP.
#include <doctest/doctest.h>

#include "dist_fp8_checks.hpp"
#include "dist_mlp_checks.hpp"
#include "dist_support.hpp"
#include "mlp_cases.hpp"
#include "support.hpp"
#include "tapegrad/ops/dist.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using namespace tapegrad::mlp_test;

namespace {

TEST_CASE_TEMPLATE("the tensor-parallel node equals the unsharded one: y and every gradient", T, double, float) {
  const auto world = test::test_world();
  check_sharded_cases<T>(world, test::shared_seed(world), Device::cpu(), cpu_sharding_tolerance<T>());
}

// In double the sharded fp8 node quantizes what the unsharded one does with the same scales (the amaxes reduced over
// the ranks): only the sums over the ranks round in another order; in f32 within the fp8 tests' bounds.
TEST_CASE("the tensor-parallel fp8 node equals the unsharded one for every recipe, its amaxes the same on every rank") {
  const auto world = test::test_world();
  const std::uint64_t seed = test::shared_seed(world);
  check_sharded_fp8_cases<double>(
      world, seed, Device::cpu(),
      [](const Tensor<double>& got, const Tensor<double>& want, double) {
        test::check_close(got, want, cpu_sharding_tolerance<double>());
      },
      1e-12);
  check_sharded_fp8_cases<float>(
      world, seed, Device::cpu(),
      [](const Tensor<float>& got, const Tensor<double>& want, double bound) {
        CHECK(test::relative_error(got, want) <= bound);
      },
      1e-5);
}

TEST_CASE("a NaN in one rank's shard makes every rank refuse the fp8 step, naming the tensor") {
  const auto world = test::test_world();
  const int bad_rank = world.size() - 1;
  Case c{.options = {.tensor_parallel = TensorParallel{world}}, .biases = false};
  const Params<float> whole = make_params<float>(c, 4, 4 * world.size(), 1);
  Params<float> p = whole;
  Tensor<float> w1 = block_of(whole.w1.value(), 2, world.rank(), world.size()).clone();
  if (world.rank() == bad_rank) w1.flat(3) = NAN;
  p.w1 = param(w1);
  p.w2 = param_block(whole.w2, 0, world.rank(), world.size());
  const Var<float> x = param(randn<float>({2, 4}, 2));
  SUBCASE("current scaling refuses it in the forward") {
    c.options.fp8 = Fp8Quantization{.recipe = fp8::CurrentScaling{}};
    CHECK_THROWS_WITH_AS(node(x, p, c.options), doctest::Contains("layernorm_mlp: fp8: w1 holds an infinity or a NaN"),
                         Error);
  }
  SUBCASE("delayed scaling refuses the step when the next one starts") {
    c.options.fp8 = fp8_quantization(fp8::DelayedScaling{.amax_history_len = 2});
    backward(sum(node(x, p, c.options).y));
    CHECK_THROWS_WITH_AS(node(x, p, c.options),
                         doctest::Contains("fp8 delayed scaling: the amax of w1 at step 0 is nan"), Error);
    CHECK(c.options.fp8->state->steps() == 0);
  }
  Tape::active().clear();
}

// Megatron's tensor-parallel MLP by hand: x replicated into a column-sharded product, a row-sharded product
// all-reduced; and its sequence-parallel form (x's rows all-gathered, the output reduce-scattered).
TEST_CASE("a model sharded by hand with the differentiable collectives has the unsharded gradients") {
  const auto world = test::test_world();
  const int p = world.size(), r = world.rank();
  const std::uint64_t seed = test::shared_seed(world);
  const std::int64_t M = 8, H = 6, F = 12;
  const Tensor<double> xv = randn<double>({M, H}, seed), w1v = randn<double>({H, F}, seed + 1),
                       w2v = randn<double>({F, H}, seed + 2), weights = randn<double>({M, H}, seed + 3);
  const Var<double> x_all = param(xv), w1_all = param(w1v), w2_all = param(w2v);
  backward(sum(matmul(tanh(matmul(x_all, w1_all)), w2_all) * constant(weights)));

  for (bool sequence : {false, true}) {
    CAPTURE(sequence);
    const Var<double> x = param(sequence ? block_of(xv, 0, r, p) : xv);
    const Var<double> w1 = param(block_of(w1v, 1, r, p)), w2 = param(block_of(w2v, 0, r, p));
    const Var<double> x_in = sequence ? dist::all_gather(world, x) : dist::replicate(world, x);
    const Var<double> partial = matmul(tanh(matmul(x_in, w1)), w2);
    const Var<double> y = sequence ? dist::reduce_scatter(world, partial) : dist::all_reduce(world, partial);
    backward(sum(y * constant(sequence ? block_of(weights, 0, r, p) : weights)));
    const auto tol = cpu_sharding_tolerance<double>();
    test::check_close(x.grad(), sequence ? block_of(x_all.grad(), 0, r, p) : x_all.grad(), tol);
    test::check_close(w1.grad(), block_of(w1_all.grad(), 1, r, p), tol);
    test::check_close(w2.grad(), block_of(w2_all.grad(), 0, r, p), tol);
  }
  Tape::active().clear();
}

}  // namespace

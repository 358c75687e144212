// layernorm_mlp under tensor parallelism (and with sequence parallelism) over 1, 2 and 4 ranks, against the
// unsharded node on the whole block: y and every gradient, for both norms × a plain and a gated activation ×
// biases × recompute policies × returning h, in f64 and f32. Also the differentiable collectives of ops/dist.hpp
// in a hand-sharded MLP.
#include <doctest/doctest.h>

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

TEST_CASE("a tensor-parallel fp8 node is refused") {
  const auto world = test::test_world();
  const Case c{.options = {.fp8 = Fp8Quantization{.recipe = fp8::CurrentScaling{}}, .tensor_parallel = TensorParallel{world}}};
  const Params<float> p = make_params<float>(c, 4, 4, 1);
  CHECK_THROWS_WITH_AS(node(param(randn<float>({2, 4}, 2)), p, c.options),
                       doctest::Contains("fp8 quantization and tensor parallelism together"), Error);
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

// layernorm_mlp under tensor parallelism (and with sequence parallelism) over 1, 2 and 4 ranks, against the
// unsharded node on the whole block: y and every gradient, for both norms × a plain and a gated activation ×
// biases × recompute policies × returning h, in f64 and f32. Also the differentiable collectives of ops/dist.hpp
// in a hand-sharded MLP.
#include <doctest/doctest.h>

#include "dist_support.hpp"
#include "mlp_cases.hpp"
#include "support.hpp"
#include "tapegrad/ops/dist.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using namespace tapegrad::mlp_test;

namespace {

// Rank r's block of `t` along `axis`, of `parts` equal blocks.
template <class T> Tensor<T> block_of(const Tensor<T>& t, int axis, int r, int parts) {
  const std::int64_t size = t.dim(axis) / parts;
  return slice(constant(t), axis, r * size, (r + 1) * size).value();
}
template <class T> Var<T> param_block(const Var<T>& v, int axis, int r, int parts) {
  return v.defined() ? param(block_of(v.value(), axis, r, parts)) : Var<T>();
}
template <class T> Tensor<double> block_of_grad(const Var<T>& v, int axis, int r, int parts) {
  return cast<double>(block_of(v.grad(), axis, r, parts));
}

// |sharded - unsharded| within these: the sums over the ranks' partial products round in another order.
template <class T> test::Tolerance tolerance() {
  return std::is_same_v<T, double> ? test::Tolerance{1e-11, 1e-11, true} : test::Tolerance{2e-5, 2e-5, true};
}

template <class T> void check_sharded_node(const dist::Communicator& world, const Case& c, bool sequence,
                                           std::uint64_t seed) {
  const int p = world.size(), r = world.rank();
  const std::int64_t M = 8, H = 16, F = 24;  // M and F split over 1, 2 and 4 ranks
  const Params<T> whole = make_params<T>(c, H, F, seed);
  const Tensor<T> xv = randn<T>({2, M / 2, H}, seed + 10, 0.2, 1.3);
  const Tensor<T> dy = randn<T>({2, M / 2, H}, seed + 11), dh = randn<T>({2, M / 2, H}, seed + 12);
  auto loss_of = [&](const LayerNormMLPOutput<T>& out, const Tensor<T>& dy_part, const Tensor<T>& dh_part) {
    Var<T> loss = sum(out.y * constant(dy_part));
    if (out.layernorm_output.defined()) loss = loss + sum(out.layernorm_output * constant(dh_part));
    return loss;
  };

  // The unsharded node on the whole block (every rank computes it alike).
  const Var<T> x_all = param(xv);
  const LayerNormMLPOutput<T> want = node(x_all, whole, c.options);
  backward(loss_of(want, dy, dh));

  // This rank's shard: W1's and b1's columns, W2's rows; with sequence parallelism x's rows (flattened [M, H]).
  Params<T> shard = whole;
  shard.w1 = param_block(whole.w1, 2, r, p);
  shard.b1 = param_block(whole.b1, 1, r, p);
  shard.w2 = param_block(whole.w2, 0, r, p);
  for (Var<T>* v : {&shard.gamma, &shard.beta, &shard.b2}) {
    if (v->defined()) *v = param(v->value());
  }
  auto rows = [&](const Tensor<T>& t) {
    return sequence ? block_of(t.reshape(Shape{M, H}), 0, r, p) : t;
  };
  const Var<T> x = param(rows(xv));
  LayerNormMLPOptions options = c.options;
  options.tensor_parallel = TensorParallel{world, sequence};
  const LayerNormMLPOutput<T> got = node(x, shard, options);
  backward(loss_of(got, rows(dy), rows(dh)));

  const auto tol = tolerance<T>();
  test::check_close(got.y.value(), cast<double>(rows(want.y.value())), tol);
  if (c.options.return_layernorm_output) {
    test::check_close(got.layernorm_output.value(), cast<double>(rows(want.layernorm_output.value())), tol);
  }
  test::check_close(x.grad(), cast<double>(rows(x_all.grad())), tol);
  test::check_close(shard.w1.grad(), block_of_grad(whole.w1, 2, r, p), tol);
  test::check_close(shard.w2.grad(), block_of_grad(whole.w2, 0, r, p), tol);
  test::check_close(shard.gamma.grad(), cast<double>(whole.gamma.grad()), tol);
  if (c.biases) {
    test::check_close(shard.b1.grad(), block_of_grad(whole.b1, 1, r, p), tol);
    test::check_close(shard.b2.grad(), cast<double>(whole.b2.grad()), tol);
  }
  if (c.has_beta()) test::check_close(shard.beta.grad(), cast<double>(whole.beta.grad()), tol);
  Tape::active().clear();
}

TEST_CASE_TEMPLATE("the tensor-parallel node equals the unsharded one: y and every gradient", T, double, float) {
  const auto world = test::test_world();
  const std::uint64_t seed = test::shared_seed(world);
  for (bool sequence : {false, true}) {
    for (Activation act : {Activation::gelu, Activation::swiglu}) {
      for (NormType norm : {NormType::layernorm, NormType::rmsnorm}) {
        for (bool biases : {true, false}) {
          for (Recompute policy : all_policies) {
            for (bool return_h : {false, true}) {
              const Case c{.options = {.norm = norm, .activation = act, .return_layernorm_output = return_h,
                                       .recompute = policy},
                           .biases = biases};
              const std::string what = describe(c) + (sequence ? ", sequence parallel" : ", tensor parallel");
              CAPTURE(what);
              check_sharded_node<T>(world, c, sequence, seed);
            }
          }
        }
      }
    }
  }
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
    const auto tol = tolerance<double>();
    test::check_close(x.grad(), sequence ? block_of(x_all.grad(), 0, r, p) : x_all.grad(), tol);
    test::check_close(w1.grad(), block_of(w1_all.grad(), 1, r, p), tol);
    test::check_close(w2.grad(), block_of(w2_all.grad(), 0, r, p), tol);
  }
  Tape::active().clear();
}

}  // namespace

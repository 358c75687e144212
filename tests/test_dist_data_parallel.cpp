// Data parallelism under mpirun (1, 2 and 4 ranks): a run whose ranks each train on their share of the batch ends
// with the parameters of one process trained on the whole batch; broadcast_parameters; buckets that start during
// backward.
#include <doctest/doctest.h>

#include "dist_support.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;

namespace {

constexpr std::int64_t batch = 8, hidden = 6;

template <class P> nn::LayerNormMLP<P> make_model(std::uint64_t seed) {
  return nn::LayerNormMLP<P>(hidden, {.intermediate_dim = 10, .activation = Activation::swiglu,
                                      .bias_init = Initializer::normal(0.1)},
                             seed);
}

// Four Adam steps on mse_loss over rows [first, first + rows) of the batch.
template <class P>
void train(nn::LayerNormMLP<P>& model, const Tensor<P>& x, const Tensor<P>& target, std::int64_t first,
           std::int64_t rows, nn::DataParallel* ddp) {
  optim::Adam adam(model.parameters(), {.lr = 1e-2});
  const Var<P> xs = constant(slice(constant(x), 0, first, first + rows).value());
  const Var<P> ts = constant(slice(constant(target), 0, first, first + rows).value());
  for (int step = 0; step < 4; ++step) {
    backward(mse_loss(model(xs), ts));
    if (ddp) {
      if (step == 0) MESSAGE("buckets started during backward: ", ddp->started_buckets(), " of ", ddp->bucket_count());
      CHECK(ddp->started_buckets() == ddp->bucket_count());  // every parameter is used: backward started them all
      ddp->finish_gradients();
    }
    adam.step();
    adam.zero_grad();
    Tape::active().clear();
  }
}

TEST_CASE_TEMPLATE("data-parallel training equals one process on the whole batch", P, double, float) {
  const auto world = test::test_world();
  const int p = world.size(), r = world.rank();
  const std::uint64_t seed = test::shared_seed(world);
  const Tensor<P> x = randn<P>({batch, hidden}, seed + 1), target = randn<P>({batch, hidden}, seed + 2);

  auto reference = make_model<P>(seed);
  train(reference, x, target, 0, batch, nullptr);

  for (std::size_t bucket_bytes : {std::size_t{64}, std::size_t{25} << 20}) {
    CAPTURE(bucket_bytes);
    auto model = make_model<P>(seed + 100 + static_cast<std::uint64_t>(r));  // each rank starts elsewhere ...
    nn::broadcast_parameters(model, world);                                   // ... until rank 0's values arrive
    const auto start = make_model<P>(seed + 100);
    const nn::ParameterList mine = model.parameters(), rank0 = start.parameters();
    for (std::size_t i = 0; i < mine.size(); ++i) {
      CHECK(cast<double>(std::get<Var<P>>(mine[i].var).value()).to_vector() ==
            cast<double>(std::get<Var<P>>(rank0[i].var).value()).to_vector());
    }
    // Rank 0's start is another model than the reference's: train the reference from it too.
    auto whole = make_model<P>(seed + 100);
    train(whole, x, target, 0, batch, nullptr);
    nn::DataParallel ddp(model, world, {.bucket_bytes = bucket_bytes});
    if (bucket_bytes == 64) CHECK(ddp.bucket_count() > 2);
    train(model, x, target, r * (batch / p), batch / p, &ddp);

    const auto tol = std::is_same_v<P, double> ? test::Tolerance{1e-10, 1e-10, true} : test::Tolerance{1e-4, 1e-4, true};
    const nn::ParameterList got = model.parameters(), want = whole.parameters();
    for (std::size_t i = 0; i < got.size(); ++i) {
      CAPTURE(got[i].path);
      test::check_close(std::get<Var<P>>(got[i].var).value(), cast<double>(std::get<Var<P>>(want[i].var).value()), tol);
    }
  }
}

TEST_CASE("a parameter no node uses counts as a zero gradient, and hooks refuse non-leaves") {
  const auto world = test::test_world();
  auto model = make_model<double>(7);
  nn::DataParallel ddp(model, world, {.bucket_bytes = 64});
  backward(sum(param(randn<double>({2}, 1))));  // a pass that reaches none of the model's parameters
  CHECK(ddp.started_buckets() == 0);
  ddp.finish_gradients();
  for (const auto& parameter : model.parameters()) {
    const Tensor<double>& g = std::get<Var<double>>(parameter.var).grad();
    REQUIRE(g.defined());
    for (double v : g.to_vector()) CHECK(v == 0.0);
  }
  const Var<double> y = param(randn<double>({2}, 2)) * 2.0;
  CHECK_THROWS_WITH_AS(GradientHook(y, [] {}), doctest::Contains("is not a leaf"), AutodiffError);
  CHECK_THROWS_WITH_AS(GradientHook(model.wi_kernel(), [] {}), doctest::Contains("already has a hook"), AutodiffError);
  Tape::active().clear();
}

}  // namespace

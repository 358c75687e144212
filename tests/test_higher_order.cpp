// Higher-order gradients: backward(create_graph) and grad(), second derivatives of every op family checked by
// gradgradcheck in double, Hessian-vector and Jacobian-vector products against finite differences, and the errors of
// the new paths. Inputs are fresh random draws each run (the seed is reported on failure).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "higher_order_cases.hpp"

using namespace tapegrad;
using namespace tapegrad::higher_order_test;

namespace {

void check_cases(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    const std::uint64_t seed = fresh_seed();
    CAPTURE(c.name);
    CAPTURE(seed);
    const GradcheckResult result = gradgradcheck(c.f, inputs_for(c, seed));
    CHECK_MESSAGE(result.passed, result.report);
  }
}

}  // namespace

TEST_CASE("grad returns the gradients as Vars and leaves every .grad alone") {
  Var<double> x = param(from_vector<double>({1.0, 2.0, 3.0}, {3}));
  Var<double> w = param(from_vector<double>({0.5, -1.0, 2.0}, {3}));
  const Var<double> y = sum(x * x * w);
  const std::vector<Var<double>> g = grad({y}, {x});
  REQUIRE(g.size() == 1);
  CHECK(g[0].value().to_vector() == std::vector<double>{1.0, -4.0, 12.0});  // 2·x·w
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());
  CHECK_FALSE(g[0].requires_grad());  // without create_graph: a constant
}

TEST_CASE("backward with create_graph makes the gradient differentiable again") {
  Var<double> x = param(from_vector<double>({0.5, -1.5}, {2}));
  backward(sum(x * x * x), {.create_graph = true});
  CHECK(x.grad().to_vector() == std::vector<double>{0.75, 6.75});  // 3x²
  const Var<double> dx = x.grad_var();
  REQUIRE(dx.defined());
  CHECK(dx.requires_grad());
  x.zero_grad();
  backward(sum(dx));
  CHECK(x.grad().to_vector() == std::vector<double>{3.0, -9.0});  // 6x
}

TEST_CASE("a gradient penalty's gradient reaches the parameters (WGAN-GP's ‖∇ₓD‖²)") {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  const Tensor<double> x0 = randn<double>({4, 3}, seed), w0 = randn<double>({3, 1}, seed + 1);
  const auto critic = [](const Var<double>& x, const Var<double>& w) { return sum(tanh(matmul(x, w))); };
  Var<double> x = param(x0), w = param(w0);
  const Var<double> dx = grad({critic(x, w)}, {x}, {.create_graph = true})[0];
  backward(sum(dx * dx));
  REQUIRE(w.grad().defined());
  // Against central differences of the penalty in w, each penalty from a first-order grad.
  const auto penalty = [&](std::int64_t i, double shift) {
    Tensor<double> wv = w0.clone();
    wv.flat(i) += shift;
    Var<double> xs = param(x0);
    const Tensor<double> g = grad({critic(xs, constant(wv))}, {xs})[0].value();
    double total = 0;
    for (std::int64_t k = 0; k < g.numel(); ++k) total += g.flat(k) * g.flat(k);
    return total;
  };
  const double eps = 1e-6;
  for (std::int64_t i = 0; i < 3; ++i) {
    CHECK(w.grad().flat(i) == doctest::Approx((penalty(i, eps) - penalty(i, -eps)) / (2 * eps)).epsilon(1e-6));
  }
}

TEST_CASE("elementwise ops and activations are twice differentiable") { check_cases(elementwise_cases()); }

TEST_CASE("matmul, reductions and layout ops are twice differentiable") { check_cases(tensor_cases()); }

TEST_CASE("softmax, norms and losses are twice differentiable") { check_cases(norm_and_loss_cases()); }

namespace {

// Rows or columns [r·n, (r + 1)·n) of t: rank r's shard.
Tensor<double> shard(const Tensor<double>& t, int axis, int r, int ranks) {
  const std::int64_t n = t.dim(axis) / ranks;
  return slice(constant(t), axis, r * n, (r + 1) * n).value().clone();
}

}  // namespace

// The collectives follow Megatron's conventions (ops/dist.hpp), which are derivatives of the one global loss, not of
// each rank's function: so their check is the one of tensor and sequence parallelism, the Hessian-vector products
// of a sharded two-layer block on each rank against the shards of the one-process product.
TEST_CASE("the differentiable collectives are twice differentiable: sharded Hessian-vector products (in-process)") {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  constexpr int ranks = 2;
  const Tensor<double> x = randn<double>({4, 3}, seed), w1 = randn<double>({3, 6}, seed + 1, 0.0, 0.6),
                       w2 = randn<double>({6, 3}, seed + 2, 0.0, 0.6), c = randn<double>({4, 3}, seed + 3);
  const std::vector<Tensor<double>> v = {randn<double>({4, 3}, seed + 4), randn<double>({3, 6}, seed + 5),
                                         randn<double>({6, 3}, seed + 6)};
  // loss(x, W1, W2) = Σ tanh(tanh(x·W1)·W2) ⊙ c
  const std::vector<Tensor<double>> whole = hvp<double>(
      [&](const Inputs& in) { return sum(tanh(matmul(tanh(matmul(in[0], in[1])), in[2])) * constant(c)); },
      {x, w1, w2}, v);
  const std::vector<dist::Communicator> comms = dist::Communicator::in_process(ranks);
  for (const bool sequence_parallel : {false, true}) {
    CAPTURE(sequence_parallel);
    // Tensor parallel: x and the loss replicated, W1 by columns, W2 by rows (replicate, then all_reduce). Sequence
    // parallel: x and the loss by rows besides (all_gather, then reduce_scatter), the global loss their sum.
    std::vector<std::vector<Tensor<double>>> got(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        const dist::Communicator& comm = comms[static_cast<std::size_t>(r)];
        const auto rows = [&](const Tensor<double>& t) { return sequence_parallel ? shard(t, 0, r, ranks) : t; };
        const DifferentiableFunction<double> loss = [&](const Inputs& in) {
          const Var<double> h = sequence_parallel ? dist::all_gather(comm, in[0]) : dist::replicate(comm, in[0]);
          const Var<double> partial = matmul(tanh(matmul(h, in[1])), in[2]);
          const Var<double> y =
              sequence_parallel ? dist::reduce_scatter(comm, partial) : dist::all_reduce(comm, partial);
          return sum(tanh(y) * constant(rows(c)));
        };
        got[static_cast<std::size_t>(r)] =
            hvp(loss, {rows(x), shard(w1, 1, r, ranks), shard(w2, 0, r, ranks)},
                {rows(v[0]), shard(v[1], 1, r, ranks), shard(v[2], 0, r, ranks)});
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < ranks; ++r) {
      CAPTURE(r);
      const std::vector<Tensor<double>>& hv = got[static_cast<std::size_t>(r)];
      const Tensor<double> want[] = {sequence_parallel ? shard(whole[0], 0, r, ranks) : whole[0],
                                     shard(whole[1], 1, r, ranks), shard(whole[2], 0, r, ranks)};
      for (std::size_t k = 0; k < 3; ++k) {
        CAPTURE(k);
        for (std::int64_t i = 0; i < want[k].numel(); ++i) {
          CHECK(hv[k].flat(i) == doctest::Approx(want[k].flat(i)).epsilon(1e-12).scale(1.0));
        }
      }
    }
  }
}

TEST_CASE("gradgradcheck fails on a wrong second derivative") {
  struct Saved {};
  const F wrong = [](const Inputs& in) {
    return sum(custom_op<Saved>(
        "square_with_a_wrong_second_derivative", [](Saved&, const Tensor<double>& x) { return cast<double>(x); },
        [](const Saved&, const NeedsGrad&, const Tensor<double>& dy) { return dy; },
        graph_backward([](const Saved&, const NeedsGrad&, const std::tuple<Var<double>>& x, const Var<double>& dy) {
          return Var<double>(dy * std::get<0>(x));  // the first derivative of x is 1, not x
        }),
        Var<double>(in[0] * in[0])));
  };
  CHECK_FALSE(gradgradcheck(wrong, {rand_uniform<double>({3}, fresh_seed(), 0.3, 1.2)}).passed);
}

TEST_CASE("a custom_op is twice differentiable with graph_backward, and says so without it") {
  struct Saved {
    Tensor<double> x;
  };
  const auto cube = [](const Var<double>& x, bool recorded) {
    const auto forward = [](Saved& s, const Tensor<double>& v) {
      s.x = v;
      Tensor<double> y(v.shape());
      for (std::int64_t i = 0; i < v.numel(); ++i) y.flat(i) = v.flat(i) * v.flat(i) * v.flat(i);
      return y;
    };
    const auto backward = [](const Saved& s, const NeedsGrad&, const Tensor<double>& dy) {
      Tensor<double> dx(dy.shape());
      for (std::int64_t i = 0; i < dy.numel(); ++i) dx.flat(i) = 3 * s.x.flat(i) * s.x.flat(i) * dy.flat(i);
      return dx;
    };
    if (!recorded) return custom_op<Saved>("cube", forward, backward, x);
    return custom_op<Saved>(
        "cube", forward, backward,
        graph_backward([](const Saved&, const NeedsGrad&, const std::tuple<Var<double>>& in, const Var<double>& dy) {
          const Var<double>& v = std::get<0>(in);
          return Var<double>(3.0 * v * v * dy);
        }),
        x);
  };
  CHECK(gradgradcheck([&](const Inputs& in) { return sum(cube(in[0], true)); },
                      {rand_uniform<double>({4}, fresh_seed(), -1.0, 1.0)}));
  Var<double> x = param(from_vector<double>({2.0}, {1}));
  const Var<double> g = grad({sum(cube(x, false))}, {x}, {.create_graph = true})[0];
  CHECK(g.value().flat(0) == 12.0);  // the first derivative is there
  CHECK_THROWS_WITH_AS(backward(sum(g)),
                       doctest::Contains("cube: a second derivative through this op is not available"), AutodiffError);
}

TEST_CASE("hvp matches finite differences of the gradient, jvp those of the function") {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  const DifferentiableFunction<double> f = [](const Inputs& in) {
    return sum(tanh(matmul(in[0], in[1])) * exp(in[0] * 0.2)) + mean(square(in[1]));
  };
  const std::vector<Tensor<double>> x = {randn<double>({3, 4}, seed), randn<double>({4, 4}, seed + 1)};
  const std::vector<Tensor<double>> v = {randn<double>({3, 4}, seed + 2), randn<double>({4, 4}, seed + 3)};
  const std::vector<Tensor<double>> hv = hvp(f, x, v), numeric = numeric_hvp(f, x, v);
  for (std::size_t k = 0; k < x.size(); ++k) {
    for (std::int64_t i = 0; i < x[k].numel(); ++i) {
      CHECK(hv[k].flat(i) == doctest::Approx(numeric[k].flat(i)).epsilon(1e-6).scale(1.0));
    }
  }
  const DifferentiableFunction<double> g = [](const Inputs& in) { return tanh(matmul(in[0], in[1])); };
  const Tensor<double> ju = jvp(g, x, v);
  const auto value_at = [&](double step) {
    std::vector<Var<double>> in;
    for (const Tensor<double>& t : moved(x, v, step)) in.push_back(constant(t));
    return g(in).value();
  };
  const double eps = 1e-5;
  const Tensor<double> up = value_at(eps), down = value_at(-eps);
  for (std::int64_t i = 0; i < ju.numel(); ++i) {
    CHECK(ju.flat(i) == doctest::Approx((up.flat(i) - down.flat(i)) / (2 * eps)).epsilon(1e-6).scale(1.0));
  }
}

TEST_CASE("grad's misuse errors name what is wrong") {
  Var<double> x = param(from_vector<double>({1.0, 2.0}, {2}));
  Var<double> unused = param(from_vector<double>({3.0}, {1}));
  const Var<double> c = constant(from_vector<double>({1.0}, {1}));
  const Var<double> y = sum(x * x);
  CHECK_THROWS_WITH_AS(grad({y}, {x, unused}, {.retain_graph = true}),
                       doctest::Contains("input 1 of shape [1] was not used"), AutodiffError);
  const std::vector<Var<double>> g = grad({y}, {x, unused}, {.retain_graph = true, .allow_unused = true});
  CHECK(g[0].defined());
  CHECK_FALSE(g[1].defined());
  CHECK_THROWS_WITH_AS(grad({y}, {c}), doctest::Contains("input 0 of shape [1] does not require grad"), AutodiffError);
  CHECK_THROWS_WITH_AS(grad({Var<double>(x * 2.0)}, {x}), doctest::Contains("is not a scalar"), AutodiffError);
  CHECK_THROWS_WITH_AS(grad({y}, {x}, {.seeds = {c, c}}), doctest::Contains("2 seeds for 1 outputs"), AutodiffError);
  {
    NoGradGuard off;
    CHECK_THROWS_WITH_AS(backward(y, {.create_graph = true}), doctest::Contains("NoGradGuard is alive"), AutodiffError);
  }
  // A second derivative of a gradient made without create_graph: a constant, named as such.
  const Var<double> plain = grad({sum(x * x)}, {x})[0];
  CHECK_THROWS_WITH_AS(backward(sum(plain * plain)), doctest::Contains("made without create_graph"), AutodiffError);
}

TEST_CASE("a second derivative through released saved tensors says to keep them") {
  Var<double> x = param(from_vector<double>({1.0, 2.0}, {2}));
  const Var<double> y = exp(x);  // its node keeps x
  const Var<double> loss = sum(y * y);
  backward(loss);  // releases the nodes' saved tensors
  CHECK_THROWS_WITH_AS(backward(loss, {.create_graph = true}), doctest::Contains("create_graph = true"), AutodiffError);
}

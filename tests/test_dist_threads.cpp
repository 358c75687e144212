// dist::Communicator::in_process: ranks that are threads of one process (no MPI): every collective in every dtype,
// the tensor-parallel node against the unsharded one, disagreements, and a rank that never comes.
#include <doctest/doctest.h>

#include <algorithm>
#include <optional>
#include <random>

#include "dist_checks.hpp"
#include "dist_mlp_checks.hpp"
#include "dist_support.hpp"
#include "support.hpp"

TYPE_TO_STRING(tapegrad::f8e4m3);
TYPE_TO_STRING(tapegrad::f8e5m2);

using namespace tapegrad;
using namespace std::chrono_literals;

namespace {

TEST_CASE_TEMPLATE("threads of one process run every collective", T, DIST_DTYPES) {
  for (int size : {1, 2, 3}) {
    CAPTURE(size);
    test::on_threads(size, [](const dist::Communicator& comm) { test::check_collectives<T>(comm); });
  }
}

TEST_CASE_TEMPLATE("the tensor-parallel node on threads equals the unsharded one", T, double, float) {
  const std::uint64_t seed = std::random_device{}();
  MESSAGE("seed ", seed);
  test::on_threads(2, [&](const dist::Communicator& comm) {
    mlp_test::check_sharded_cases<T>(comm, seed, Device::cpu(), mlp_test::cpu_sharding_tolerance<T>());
  });
}

// Where a sharded module's tensors are this rank's block: the axis (x's, the output's), or -1 for the whole tensor.
struct Sharding {
  int x_axis = -1, out_axis = -1;
};

// A module made sharded (make(TensorParallel)) against the unsharded one of the same seed (make(nullopt)), on every
// rank: the output, dx and every parameter's gradient (a shard's against its block of the whole gradient), for
// Σ y·w with w random. With sequence_parallel each rank's loss is its rows' part of the whole one.
template <class Make>
void check_sharded_module(const dist::Communicator& comm, bool sequence, Make make, const Shape& in, Sharding s,
                          std::uint64_t seed) {
  const auto local = [&](const Tensor<double>& t, int axis) {
    return axis < 0 ? t : mlp_test::block_of(t, axis, comm.rank(), comm.size());
  };
  const auto whole = make(std::optional<TensorParallel>{});
  const auto shard = make(std::optional<TensorParallel>{TensorParallel{comm, sequence}});
  const Tensor<double> x = randn<double>(in, seed);
  const Var<double> xw = param(x), xs = param(local(x, s.x_axis));
  const Var<double> yw = whole(xw);
  const Tensor<double> w = randn<double>(yw.shape(), seed + 1);
  backward(sum(yw * constant(w)));
  const Var<double> ys = shard(xs);
  backward(sum(ys * constant(local(w, s.out_axis))));
  const test::Tolerance tol{1e-11, 1e-12, true};
  test::check_close(ys.value(), local(yw.value(), s.out_axis), tol);
  test::check_close(xs.grad(), local(xw.grad(), s.x_axis), tol);
  const nn::ParameterList whole_parameters = whole.parameters();
  for (const nn::NamedParameter& p : shard.parameters()) {
    CAPTURE(p.path);
    const auto same = std::find_if(whole_parameters.begin(), whole_parameters.end(),
                                   [&](const nn::NamedParameter& q) { return q.path == p.path; });
    REQUIRE(same != whole_parameters.end());
    const Tensor<double>& whole_grad = std::get<Var<double>>(same->var).grad();
    test::check_close(std::get<Var<double>>(p.var).grad(), p.shard ? local(whole_grad, p.shard->axis) : whole_grad,
                      tol);
  }
}

TEST_CASE("sharded modules on threads equal the unsharded ones: Dense's modes, MultiHeadAttention, TransformerLayer") {
  const std::uint64_t seed = std::random_device{}();
  MESSAGE("seed ", seed);
  using Parallel = nn::DenseConfig::Parallel;
  using Tp = std::optional<TensorParallel>;
  for (const int ranks : {2, 4}) {
    for (const bool sequence : {false, true}) {
      CAPTURE(ranks);
      CAPTURE(sequence);
      test::on_threads(ranks, [&](const dist::Communicator& comm) {
        const int rows = sequence ? 0 : -1;  // x and the output sharded over their first axis with sequence_parallel
        check_sharded_module(
            comm, sequence,
            [](Tp tp) { return nn::Dense<double>(6, {.features = 8, .tensor_parallel = tp}, 3); }, {8, 6},
            {rows, 1}, seed);
        check_sharded_module(
            comm, sequence,
            [](Tp tp) {
              return nn::Dense<double>(8, {.features = 6, .tensor_parallel = tp, .parallel = Parallel::row}, 4);
            },
            {8, 8}, {1, rows}, seed + 10);
        check_sharded_module(
            comm, sequence,
            [](Tp tp) {
              return nn::LayerNormDense<double>(6, {.dense = {.features = 8, .tensor_parallel = tp}}, 5);
            },
            {8, 6}, {rows, 1}, seed + 20);
        const auto attention = [](Tp tp) {
          return nn::MultiHeadAttention<double>(
              6, {.num_heads = 8, .num_kv_heads = 4, .head_dim = 2, .causal = true, .rope = nn::RopeOptions{},
                  .tensor_parallel = tp}, 6);
        };
        check_sharded_module(comm, sequence, attention, {4, 5, 6}, {rows, rows}, seed + 30);
        const auto layer = [](Tp tp) {
          return nn::TransformerLayer<double>(
              6, {.num_heads = 4, .num_kv_heads = 4, .head_dim = 3, .ffn_dim = 8, .tensor_parallel = tp}, 7);
        };
        check_sharded_module(comm, sequence, layer, {4, 5, 6}, {rows, rows}, seed + 40);
      });
    }
  }
}

TEST_CASE("threads that call different collectives all get an error naming each rank's call") {
  test::on_threads(3, [](const dist::Communicator& comm) {
    std::string message;
    try {
      comm.all_reduce(Tensor<float>(Shape{comm.rank() == 2 ? 4 : 3}));
    } catch (const Error& e) {
      message = e.what();
    }
    CHECK(message ==
          "all_reduce: the 3 ranks of communicator 'threads' did not call the same collective: ranks 0, 1: all_reduce "
          "(call 0) of f32 [3] on cpu; rank 2: all_reduce (call 0) of f32 [4] on cpu; (every rank must pass a "
          "defined tensor of the same dtype, shape and kind of device)");
    Tensor<float> one(Shape{1});
    one.flat(0) = 1;
    CHECK(comm.all_reduce(one).flat(0) == 3.0f);  // still usable
  });
}

TEST_CASE("a rank that never comes fails the others' collective, naming it, and the communicator stays failed") {
  test::on_threads(
      3,
      [](const dist::Communicator& comm) {
        if (comm.rank() == 1) return;  // never comes
        std::string first, second;
        try {
          comm.barrier();
        } catch (const dist::CommunicationError& e) {
          first = e.what();
        }
        CHECK(first.find("communicator 'threads' (rank " + std::to_string(comm.rank()) + " of 3): barrier (call 0)") !=
              std::string::npos);
        CHECK((first.find("rank(s) 1 did not come within the timeout") != std::string::npos ||
               first.find("another rank gave up waiting") != std::string::npos));
        try {
          comm.all_reduce(Tensor<float>(Shape{2}));
        } catch (const dist::CommunicationError& e) {
          second = e.what();
        }
        CHECK(second.find("the communicator cannot be used again") != std::string::npos);
      },
      300ms);
}

TEST_CASE("in_process communicators refuse a split and a size below 1") {
  CHECK_THROWS_WITH_AS(dist::Communicator::in_process(0), doctest::Contains("size must be at least 1, got 0"), Error);
  test::on_threads(1, [](const dist::Communicator& comm) {
    CHECK_THROWS_WITH_AS(comm.split(0, 0, "x"), doctest::Contains("cannot be split"), Error);
  });
}

}  // namespace

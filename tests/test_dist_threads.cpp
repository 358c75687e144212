// dist::Communicator::in_process: ranks that are threads of one process (no MPI): every collective in every dtype,
// the tensor-parallel node against the unsharded one, disagreements, a rank that never comes, and one that fails.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dist_checks.hpp"
#include "dist_fp8_checks.hpp"
#include "dist_mlp_checks.hpp"
#include "dist_support.hpp"
#include "support.hpp"
#include "tapegrad/tensor/dist/detail/group.hpp"

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
  const std::uint64_t seed = test::fresh_seed();
  MESSAGE("seed ", seed);
  test::on_threads(2, [&](const dist::Communicator& comm) {
    mlp_test::check_sharded_cases<T>(comm, seed, Device::cpu(), mlp_test::cpu_sharding_tolerance<T>());
  });
}

// In double the sharded fp8 node quantizes the values the unsharded one does with the same scales (amaxes reduced over
// the ranks; block scaling's tiles within shards): only the sums over the ranks round in another order. In f32 the
// products' sums may move an element across an fp8 rounding boundary: the fp8 tests' bounds.
TEST_CASE("the tensor-parallel fp8 node on threads equals the unsharded one, for every recipe") {
  const std::uint64_t seed = test::fresh_seed();
  MESSAGE("seed ", seed);
  for (const int ranks : {2, 4}) {
    CAPTURE(ranks);
    test::on_threads(ranks, [&](const dist::Communicator& comm) {
      mlp_test::check_sharded_fp8_cases<double>(
          comm, seed, Device::cpu(),
          [](const Tensor<double>& got, const Tensor<double>& want, double) {
            test::check_close(got, want, mlp_test::cpu_sharding_tolerance<double>());
          },
          1e-12);
      mlp_test::check_sharded_fp8_cases<float>(
          comm, seed, Device::cpu(),
          [](const Tensor<float>& got, const Tensor<double>& want, double bound) {
            CHECK(test::relative_error(got, want) <= bound);
          },
          1e-5);
    });
  }
}

TEST_CASE("block scaling's tiles cut at the shards' edges stay within the fp8 bounds of the unsharded node") {
  const std::uint64_t seed = test::fresh_seed();
  MESSAGE("seed ", seed);
  test::on_threads(2, [&](const dist::Communicator& comm) {
    for (bool sequence : {false, true}) {
      CAPTURE(sequence);
      // F / p = 96: W1's 128 x 128 blocks and a's 1 x 128 tiles end at each shard's last column.
      mlp_test::Case c{.options = {.activation = Activation::swiglu, .fp8 = Fp8Quantization{.recipe = fp8::BlockScaling{}}},
                       .biases = true};
      int checked = 0;
      mlp_test::run_sharded_node<double>(
          comm, c, sequence, seed, Device::cpu(),
          [&](const Tensor<double>& got, const Tensor<double>& want) {
            const double bound = checked++ == 0 ? mlp_test::fp8_forward_bound : mlp_test::fp8_gradient_bound;
            CHECK(test::relative_error(got, want) <= bound);
          },
          192);
    }
  });
}

// Where a sharded module's tensors are this rank's block: the axis (x's, the output's), or -1 for the whole tensor.
struct Sharding {
  int x_axis = -1, out_axis = -1;
};

// A module made sharded (make(TensorParallel)) against the unsharded one of the same seed (make(nullopt)), on every
// rank, after `steps` calls of each: the output, dx and every parameter's gradient of the last (a shard's against its
// block of the whole gradient), for Σ y·w with w random, each checked by compare(got, want). With sequence_parallel
// each rank's loss is its rows' part of the whole one. Returns both modules' state dicts.
template <class Make, class Compare>
std::pair<nn::StateDict, nn::StateDict> check_sharded_module(const dist::Communicator& comm, bool sequence, Make make,
                                                             const Shape& in, Sharding s, std::uint64_t seed,
                                                             Compare compare, int steps = 1) {
  const auto local = [&](const Tensor<double>& t, int axis) {
    return axis < 0 ? t : mlp_test::block_of(t, axis, comm.rank(), comm.size());
  };
  const auto whole = make(std::optional<TensorParallel>{});
  const auto shard = make(std::optional<TensorParallel>{TensorParallel{comm, sequence}});
  const Tensor<double> x = randn<double>(in, seed);
  const Var<double> xw = param(x), xs = param(local(x, s.x_axis));
  const auto run = [&](const auto& module, Var<double> input, const std::optional<Tensor<double>>& weights, int axis) {
    Var<double> y;
    for (int step = 0; step < steps; ++step) {
      input.zero_grad();
      for (const nn::NamedParameter& p : module.parameters()) Var<double>(std::get<Var<double>>(p.var)).zero_grad();
      y = module(input);
      backward(sum(y * constant(weights ? local(*weights, axis) : randn<double>(y.shape(), seed + 1))));
    }
    return y;
  };
  const Var<double> yw = run(whole, xw, std::nullopt, -1);
  const Var<double> ys = run(shard, xs, randn<double>(yw.shape(), seed + 1), s.out_axis);
  compare(ys.value(), local(yw.value(), s.out_axis));
  compare(xs.grad(), local(xw.grad(), s.x_axis));
  const nn::ParameterList whole_parameters = whole.parameters();
  for (const nn::NamedParameter& p : shard.parameters()) {
    CAPTURE(p.path);
    const auto same = std::find_if(whole_parameters.begin(), whole_parameters.end(),
                                   [&](const nn::NamedParameter& q) { return q.path == p.path; });
    REQUIRE(same != whole_parameters.end());
    const Tensor<double>& whole_grad = std::get<Var<double>>(same->var).grad();
    compare(std::get<Var<double>>(p.var).grad(), p.shard ? local(whole_grad, p.shard->axis) : whole_grad);
  }
  Tape::active().clear();
  return {shard.state_dict(), whole.state_dict()};
}

// The sums over the ranks round in another order.
void close_in_double(const Tensor<double>& got, const Tensor<double>& want) {
  test::check_close(got, want, {1e-11, 1e-12, true});
}

TEST_CASE("sharded modules on threads equal the unsharded ones: Dense's modes, MultiHeadAttention, TransformerLayer") {
  const std::uint64_t seed = test::fresh_seed();
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
            {rows, 1}, seed, close_in_double);
        check_sharded_module(
            comm, sequence,
            [](Tp tp) {
              return nn::Dense<double>(8, {.features = 6, .tensor_parallel = tp, .parallel = Parallel::row}, 4);
            },
            {8, 8}, {1, rows}, seed + 10, close_in_double);
        check_sharded_module(
            comm, sequence,
            [](Tp tp) {
              return nn::LayerNormDense<double>(6, {.dense = {.features = 8, .tensor_parallel = tp}}, 5);
            },
            {8, 6}, {rows, 1}, seed + 20, close_in_double);
        const auto attention = [](Tp tp) {
          return nn::MultiHeadAttention<double>(
              6, {.num_heads = 8, .num_kv_heads = 4, .head_dim = 2, .causal = true, .rope = nn::RopeOptions{},
                  .tensor_parallel = tp}, 6);
        };
        check_sharded_module(comm, sequence, attention, {4, 5, 6}, {rows, rows}, seed + 30, close_in_double);
        const auto layer = [](Tp tp) {
          return nn::TransformerLayer<double>(
              6, {.num_heads = 4, .num_kv_heads = 4, .head_dim = 3, .ffn_dim = 8, .tensor_parallel = tp}, 7);
        };
        check_sharded_module(comm, sequence, layer, {4, 5, 6}, {rows, rows}, seed + 40, close_in_double);
      });
    }
  }
}

// Every fp8 state of a module (its state dict's amax histories, with their lengths): the same on every rank, and the
// unsharded module's, exactly for the kernels (a maximum over the same values), within 1e-12 for the others.
void check_fp8_states(const dist::Communicator& comm, const nn::StateDict& shard, const nn::StateDict& whole) {
  int states = 0;
  for (const auto& [name, value] : shard) {
    if (!name.ends_with("fp8_amax_history")) continue;
    CAPTURE(name);
    ++states;
    const std::vector<float> got = value.get<float>().to_vector(), want = whole.at(name).get<float>().to_vector();
    mlp_test::check_same_on_every_rank(comm, got);
    mlp_test::check_histories_match(got, want, static_cast<int>(value.get<float>().dim(1)), 1e-12,
                                    {fp8::Role::kernel1, fp8::Role::kernel2});
  }
  CHECK(states > 0);
}

// Dense's modes and LayerNormDense with their shards 128 features wide or wider, so that block scaling's tiles lie
// within them: in double every recipe gives the unsharded module's results but for the order of the sums over the
// ranks (two calls: delayed scaling's second quantizes with the first's amaxes, reduced). MultiHeadAttention and
// TransformerLayer (fp8 in every product, heads and F too narrow for whole tiles): their results within the fp8 tests'
// bounds, delayed and current scaling's within 1e-11 too.
TEST_CASE("sharded fp8 modules on threads equal the unsharded ones for every recipe, their states the same on all ranks") {
  const std::uint64_t seed = test::fresh_seed();
  MESSAGE("seed ", seed);
  using Parallel = nn::DenseConfig::Parallel;
  using Tp = std::optional<TensorParallel>;
  for (const mlp_test::NamedRecipe& r : mlp_test::fp8_recipes) {
    const fp8::Recipe recipe = r.recipe;
    const bool blocks = std::holds_alternative<fp8::BlockScaling>(recipe);
    for (const int ranks : {2, 4}) {
      for (const bool sequence : {false, true}) {
        const std::string what = r.name + (sequence ? ", sequence parallel" : ", tensor parallel");
        CAPTURE(what);
        CAPTURE(ranks);
        test::on_threads(ranks, [&](const dist::Communicator& comm) {
          const int rows = sequence ? 0 : -1;
          const auto states = [&](const std::pair<nn::StateDict, nn::StateDict>& dicts) {
            if (std::holds_alternative<fp8::DelayedScaling>(recipe)) check_fp8_states(comm, dicts.first, dicts.second);
          };
          states(check_sharded_module(
              comm, sequence,
              [&](Tp tp) { return nn::Dense<double>(6, {.features = 512, .fp8 = recipe, .tensor_parallel = tp}, 3); },
              {8, 6}, {rows, 1}, seed, close_in_double, 2));
          states(check_sharded_module(
              comm, sequence,
              [&](Tp tp) {
                return nn::Dense<double>(
                    512, {.features = 6, .fp8 = recipe, .fp8_weight_cache = true, .tensor_parallel = tp,
                          .parallel = Parallel::row}, 4);
              },
              {8, 512}, {1, rows}, seed + 10, close_in_double, 2));
          states(check_sharded_module(
              comm, sequence,
              [&](Tp tp) {
                return nn::LayerNormDense<double>(6, {.dense = {.features = 512, .fp8 = recipe, .tensor_parallel = tp}},
                                                  5);
              },
              {8, 6}, {rows, 1}, seed + 20, close_in_double, 2));
          int checked = 0;
          const auto bounded = [&](const Tensor<double>& got, const Tensor<double>& want) {
            const double bound = checked++ == 0 ? mlp_test::fp8_forward_bound : mlp_test::fp8_gradient_bound;
            CHECK(test::relative_error(got, want) <= bound);
            if (!blocks) close_in_double(got, want);
          };
          const auto attention = [&](Tp tp) {
            return nn::MultiHeadAttention<double>(
                6, {.num_heads = 8, .num_kv_heads = 4, .head_dim = 2, .causal = true, .fp8 = recipe,
                    .tensor_parallel = tp}, 6);
          };
          states(check_sharded_module(comm, sequence, attention, {4, 5, 6}, {rows, rows}, seed + 30, bounded, 2));
          checked = 0;
          const auto layer = [&](Tp tp) {
            return nn::TransformerLayer<double>(
                6, {.num_heads = 4, .num_kv_heads = 4, .head_dim = 3, .ffn_dim = 8, .fp8 = recipe,
                    .tensor_parallel = tp}, 7);
          };
          states(check_sharded_module(comm, sequence, layer, {4, 5, 6}, {rows, rows}, seed + 40, bounded, 2));
        });
      }
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

// A rank whose own part of a collective fails once the ranks agreed on it (its memory, a CUDA error, a capturing
// stream: tests/test_gpu_dist.cpp has one end to end) aborts the group: the others' collective throws at once, naming
// its error, instead of waiting for the timeout; the collective before, which every rank finished, still succeeds on
// every rank; and the failed rank cannot start another collective that the others would take for the one it left.
TEST_CASE("a rank that fails its part of a collective fails the others' at once, naming its error") {
  constexpr int size = 3;
  const auto groups = dist::detail::thread_groups(size, {.timeout = std::chrono::minutes(5), .name = "threads"});
  std::vector<float> sums(size);
  std::vector<std::string> errors(size), later(size);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      dist::detail::Group& group = *groups[static_cast<std::size_t>(r)];
      float x = 1;
      group.all_reduce(&x, &x, 1, DType::f32);
      sums[static_cast<std::size_t>(r)] = x;
      try {
        if (r == 1) group.abort("all_reduce: out of memory (injected)");  // before its host exchange
        group.all_reduce(&x, &x, 1, DType::f32);
      } catch (const dist::CommunicationError& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
      try {
        group.barrier();
      } catch (const dist::CommunicationError& e) {
        later[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::minutes(1));
  for (int r = 0; r < size; ++r) {
    CAPTURE(r);
    CHECK(sums[static_cast<std::size_t>(r)] == size);
    const std::string failure = "communicator 'threads' (rank " + std::to_string(r) + " of 3): all_reduce: " +
                                (r == 1 ? "" : "rank 1 failed: all_reduce: ") + "out of memory (injected)";
    const std::string unusable = failure + "; the communicator cannot be used again";
    CHECK(errors[static_cast<std::size_t>(r)] == (r == 1 ? unusable : failure));
    CHECK(later[static_cast<std::size_t>(r)] == unusable);
  }
}

// NCCL refuses two ranks on one GPU: then every rank's CUDA collectives go through the host (tests/test_gpu_dist.cpp
// runs them on one GPU).
TEST_CASE("in-process ranks stage their CUDA collectives through the host when any two share a GPU") {
  using dist::detail::stage_through_host;
  CHECK_FALSE(stage_through_host(std::vector{0}));
  CHECK_FALSE(stage_through_host(std::vector{0, 1}));
  CHECK_FALSE(stage_through_host(std::vector{3, 1, 0, 2}));
  CHECK(stage_through_host(std::vector{0, 0}));
  CHECK(stage_through_host(std::vector{1, 0, 2, 1}));
}

}  // namespace

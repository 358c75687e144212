// Tensor-parallel modules and their checkpoints under mpirun (1, 2 and 4 ranks): a sharded LayerNormMLP computes what
// the unsharded module of the same seed does; each rank saves its shard; the folder loads back into the same
// sharding bitwise, into one unsharded module (p -> 1: the shards reassembled), and into another rank count; an fp8
// module's scaling state with them.
#include <doctest/doctest.h>

#include <filesystem>

#include "dist_fp8_checks.hpp"
#include "dist_support.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;

namespace {

constexpr std::int64_t hidden = 8, ffn = 16;

nn::LayerNormMLP<double> make_model(std::uint64_t seed, std::optional<TensorParallel> parallel) {
  return nn::LayerNormMLP<double>(hidden,
                                  {.intermediate_dim = ffn, .activation = Activation::swiglu,
                                   .bias_init = Initializer::normal(0.2), .tensor_parallel = parallel},
                                  seed);
}

Tensor<double> value_of(const nn::NamedParameter& p) { return std::get<Var<double>>(p.var).value(); }

bool same_values(const nn::Module& a, const nn::Module& b) {
  const nn::ParameterList pa = a.parameters(), pb = b.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    if (value_of(pa[i]).to_vector() != value_of(pb[i]).to_vector()) return false;
  }
  return pa.size() == pb.size();
}

TEST_CASE("a tensor-parallel module's checkpoint loads into the same sharding, into one process and into others") {
  const auto world = test::test_world();
  const int p = world.size(), r = world.rank();
  const std::uint64_t seed = test::shared_seed(world);
  const auto dir = std::filesystem::temp_directory_path() / ("tapegrad-sharded-" + std::to_string(seed));

  auto sharded = make_model(seed, TensorParallel{world});
  auto whole = make_model(seed, std::nullopt);
  const nn::ParameterList shards = sharded.parameters();
  CHECK(shards[2].path == "wi_kernel");
  REQUIRE(shards[2].shard.has_value());
  CHECK(shards[2].shard->axis == 2);
  CHECK(shards[2].shard->ranks == p);
  CHECK(value_of(shards[2]).shape() == Shape{hidden, 2, ffn / p});
  CHECK(!shards[0].shard.has_value());  // the norm's scale: replicated

  // The same function as the unsharded module of the same seed.
  const Var<double> x = constant(randn<double>({5, hidden}, seed + 1));
  test::check_close(sharded(x).value(), whole(x).value(), {1e-12, 1e-12, true});

  // Train a step so that the saved values are not the initial ones; then save every rank's shard.
  optim::Adam adam(sharded.parameters(), {.lr = 0.05});
  backward(sum(sharded(x)));
  adam.step();
  Tape::active().clear();
  nn::save_sharded(sharded, dir, world);

  // The same sharding: bitwise.
  auto same = make_model(seed + 1, TensorParallel{world});
  nn::load_sharded(same, dir);
  CHECK(same_values(same, sharded));

  // p -> 1: the unsharded module computes what the sharded one does, and holds the shards joined.
  auto one = make_model(seed + 2, std::nullopt);
  nn::load_sharded(one, dir);
  test::check_close(one(x).value(), sharded(x).value(), {1e-12, 1e-12, true});
  const Tensor<double> w1 = std::get<Var<double>>(one.parameters()[2].var).value();
  CHECK(slice(constant(w1), 2, r * (ffn / p), (r + 1) * (ffn / p)).value().to_vector() ==
        value_of(shards[2]).to_vector());

  // p -> another count: the ranks in pairs (4 -> 2), or each alone (2 -> 1 per rank).
  const auto group = world.split(r / 2, r, "pair");
  auto regrouped = make_model(seed + 3, TensorParallel{group});
  nn::load_sharded(regrouped, dir);
  test::check_close(regrouped(x).value(), sharded(x).value(), {1e-12, 1e-12, true});
  Tape::active().clear();

  world.barrier();
  if (r == 0) std::filesystem::remove_all(dir);
}

// Delayed scaling's state is a module's buffer, saved from rank 0's file: with the amaxes reduced over the ranks it is
// every rank's, and the unsharded module's after the same steps. Loaded into the same sharding or into one process, the
// next step quantizes with the same scales: the same results as the run that was not interrupted.
TEST_CASE("a tensor-parallel fp8 module's checkpoint carries its scaling state into the same sharding and into one") {
  const auto world = test::test_world();
  const std::uint64_t seed = test::shared_seed(world);
  const auto dir = std::filesystem::temp_directory_path() / ("tapegrad-sharded-fp8-" + std::to_string(seed));
  const auto make = [&](std::optional<TensorParallel> parallel) {
    return nn::LayerNormMLP<double>(hidden, {.intermediate_dim = ffn, .activation = Activation::swiglu,
                                             .fp8 = fp8::DelayedScaling{.amax_history_len = 4},
                                             .tensor_parallel = parallel},
                                    seed);
  };
  const Var<double> x = constant(randn<double>({5, hidden}, seed + 1));
  const auto history = [](const nn::Module& m) { return m.state_dict().at("fp8_amax_history").get<float>().to_vector(); };
  auto sharded = make(TensorParallel{world});
  auto whole = make(std::nullopt);
  for (int step = 0; step < 2; ++step) {
    backward(sum(sharded(x)));
    backward(sum(whole(x)));
  }
  Tape::active().clear();
  nn::save_sharded(sharded, dir, world);
  const std::vector<float> saved = history(sharded);
  using fp8::Role;
  mlp_test::check_histories_match(saved, history(whole), 4, 1e-12,
                                  {Role::input, Role::kernel1, Role::kernel2, Role::grad_output});

  auto same = make(TensorParallel{world});
  nn::load_sharded(same, dir);
  auto one = make(std::nullopt);
  nn::load_sharded(one, dir);
  CHECK(history(same) == saved);
  CHECK(history(one) == saved);
  const Tensor<double> next = sharded(x).value();
  test::check_close(same(x).value(), next, {1e-12, 1e-12, true});
  test::check_close(one(x).value(), next, {1e-12, 1e-12, true});
  Tape::active().clear();
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("load_sharded names what is wrong with the folder, and save_sharded a communicator that is not the shards'") {
  const auto world = test::test_world();
  const std::uint64_t seed = test::shared_seed(world);
  const auto dir = std::filesystem::temp_directory_path() / ("tapegrad-sharded-bad-" + std::to_string(seed) + "-" +
                                                              std::to_string(world.rank()));
  std::filesystem::create_directories(dir);
  auto model = make_model(seed, std::nullopt);
  CHECK_THROWS_WITH_AS(nn::load_sharded(model, dir), doctest::Contains("holds no rank-<r>-of-<p>.safetensors file"),
                       Error);
  safetensors::save(dir / "rank-1-of-2.safetensors", model.state_dict());
  CHECK_THROWS_WITH_AS(nn::load_sharded(model, dir), doctest::Contains("lacks rank-0-of-2.safetensors (1 of 2 files)"),
                       Error);
  std::filesystem::remove_all(dir);
  if (world.size() > 1) {
    const auto alone = world.split(world.rank(), 0, "alone");
    auto sharded = make_model(seed, TensorParallel{world});
    CHECK_THROWS_WITH_AS(nn::save_sharded(sharded, dir, alone), doctest::Contains("but the communicator 'alone' is rank 0 of 1"),
                         Error);
  }
}

}  // namespace

// dist::Communicator on CUDA tensors, layernorm_mlp's tensor parallelism (with fp8 too) and data parallelism on the
// GPU, each rank a thread. First one rank (NCCL with one rank, the node's collectives and side stream, the buckets'
// side stream), then several: one a GPU over NCCL when there are several GPUs; with one GPU, two ranks share it and
// their collectives are staged through host memory (NCCL refuses two ranks on one GPU).
#include <doctest/doctest.h>

#include <random>

#include "dist_checks.hpp"
#include "dist_fp8_checks.hpp"
#include "dist_mlp_checks.hpp"
#include "dist_support.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"
#include "tapegrad/tensor/gpu/device.hpp"

TYPE_TO_STRING(tapegrad::f8e4m3);
TYPE_TO_STRING(tapegrad::f8e5m2);

using namespace tapegrad;

namespace {

// The rank counts to run: one, then one rank per GPU when there are several, or two sharing the only one.
std::vector<int> rank_counts() {
  if (cuda::device_count() >= 2) return {1, cuda::device_count()};
  MESSAGE("one GPU visible: the tests of several ranks run 2 ranks on cuda:0, their collectives staged through host "
          "memory (NCCL refuses two ranks on one GPU)");
  return {1, 2};
}

// Rank r's GPU: its own, or a shared one when there are fewer GPUs than ranks.
Device device_of(const dist::Communicator& comm) { return Device::cuda(comm.rank() % cuda::device_count()); }

// |sharded - unsharded| on a GPU: the ranks' partial products summed in another order, and products that
// accumulate in another order for another F.
template <class T> test::Tolerance gpu_sharding_tolerance() {
  return std::is_same_v<T, float> ? test::Tolerance{2e-5, 2e-5, true} : test::Tolerance{2e-2, 2e-2, true};
}

TEST_CASE_TEMPLATE("every collective runs on GPUs in every dtype", T, DIST_DTYPES) {
  if (!dist::has_nccl()) {
    MESSAGE("tapegrad was built without NCCL");
    return;
  }
  for (int ranks : rank_counts()) {
    CAPTURE(ranks);
    test::on_threads(ranks, [](const dist::Communicator& comm) {
      test::check_collectives<T>(comm, device_of(comm));
    });
  }
}

// body(communicator of rank r, seed) on one thread a rank, for each rank count; the seed fresh and shared.
template <class Body> void on_gpu_ranks(Body body) {
  const std::uint64_t seed = std::random_device{}();
  MESSAGE("seed ", seed);
  for (int ranks : rank_counts()) {
    CAPTURE(ranks);
    test::on_threads(ranks, [&](const dist::Communicator& comm) { body(comm, seed); });
  }
}

TEST_CASE_TEMPLATE("the tensor-parallel node on GPUs equals the unsharded one", T, float, tapegrad::bf16) {
  if (!dist::has_nccl()) return;
  on_gpu_ranks([](const dist::Communicator& comm, std::uint64_t seed) {
    mlp_test::check_sharded_cases<T>(comm, seed, device_of(comm), gpu_sharding_tolerance<T>());
  });
}

// The fp8 node on GPUs, its amaxes reduced over NCCL (delayed scaling's gathered at each pass's end, current
// scaling's before each sharded tensor's scale): within the fp8 tests' bounds of the unsharded node, delayed scaling's
// histories the same on every rank and the unsharded run's.
TEST_CASE("the tensor-parallel fp8 node on GPUs equals the unsharded one for every recipe") {
  if (!dist::has_nccl()) return;
  on_gpu_ranks([](const dist::Communicator& comm, std::uint64_t seed) {
    mlp_test::check_sharded_fp8_cases<float>(
        comm, seed, device_of(comm),
        [](const Tensor<float>& got, const Tensor<double>& want, double bound) {
          CHECK(test::relative_error(got, want) <= bound);
        },
        1e-4);
  });
}

TEST_CASE("data-parallel training on GPUs equals one GPU on the whole batch") {
  if (!dist::has_nccl()) return;
  const std::uint64_t seed = std::random_device{}();
  constexpr std::int64_t batch = 8, hidden = 16;
  const auto model_on = [&](Device device) {
    return nn::LayerNormMLP<float>(hidden, {.intermediate_dim = 32, .bias_init = Initializer::normal(0.1)}, seed,
                                   device);
  };
  // Three Adam steps on mse_loss over rows [first, first + rows).
  const auto train = [&](nn::LayerNormMLP<float>& model, std::int64_t first, std::int64_t rows, nn::DataParallel* ddp) {
    const Device device = model.device();
    const Tensor<float> x = randn<float>({batch, hidden}, seed + 1), t = randn<float>({batch, hidden}, seed + 2);
    const Var<float> xs = constant(slice(constant(x), 0, first, first + rows).value().to(device));
    const Var<float> ts = constant(slice(constant(t), 0, first, first + rows).value().to(device));
    optim::Adam adam(model.parameters(), {.lr = 1e-2});
    for (int step = 0; step < 3; ++step) {
      backward(mse_loss(model(xs), ts));
      if (ddp) ddp->finish_gradients();
      adam.step();
      adam.zero_grad();
      Tape::active().clear();
    }
  };
  for (int ranks : rank_counts()) {
    CAPTURE(ranks);
    test::on_threads(ranks, [&](const dist::Communicator& comm) {
      const Device device = device_of(comm);
      auto whole = model_on(device);
      train(whole, 0, batch, nullptr);
      auto model = model_on(device);
      nn::DataParallel ddp(model, comm, {.bucket_bytes = 1024});
      train(model, comm.rank() * (batch / ranks), batch / ranks, &ddp);
      const nn::ParameterList got = model.parameters(), want = whole.parameters();
      for (std::size_t i = 0; i < got.size(); ++i) {
        CAPTURE(got[i].path);
        const Tensor<float> g = std::get<Var<float>>(got[i].var).value().to(Device::cpu());
        const Tensor<float> w = std::get<Var<float>>(want[i].var).value().to(Device::cpu());
        if (ranks == 1) {
          CHECK(g.to_vector() == w.to_vector());  // one rank: the average is the gradient itself, bitwise
        } else {
          test::check_close(g, cast<double>(w), {1e-4, 1e-4, true});
        }
      }
    });
  }
}

TEST_CASE("ranks that pass tensors on different kinds of device all get an error naming each rank's") {
  test::on_threads(2, [](const dist::Communicator& comm) {
    const Tensor<float> t = Tensor<float>(Shape{3}).to(comm.rank() == 0 ? Device::cpu() : Device::cuda(0));
    CHECK_THROWS_WITH_AS(comm.all_reduce(t),
                         "all_reduce: the 2 ranks of communicator 'threads' did not call the same collective: rank 0: "
                         "all_reduce (call 0) of f32 [3] on cpu; rank 1: all_reduce (call 0) of f32 [3] on cuda; (every "
                         "rank must pass a defined tensor of the same dtype, shape and kind of device)",
                         Error);
  });
}

TEST_CASE("a GPU collective in a build without NCCL says so") {
  if (dist::has_nccl()) return;
  test::on_threads(1, [](const dist::Communicator& comm) {
    CHECK_THROWS_WITH_AS(comm.all_reduce(Tensor<float>(Shape{3}).to(Device::cuda(0))),
                         doctest::Contains("need NCCL, and tapegrad was built without it"), Error);
  });
}

}  // namespace

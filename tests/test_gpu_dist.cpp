// dist::Communicator on CUDA tensors, layernorm_mlp's tensor parallelism (with fp8 too) and data parallelism on the
// GPU, each rank a thread. Over NCCL one rank (the node's collectives and side stream, the buckets' side stream), and
// one rank a GPU when there are several; then two ranks sharing cuda:0, their collectives staged through host memory
// (NCCL refuses two ranks on one GPU), which needs no NCCL. Collectives on inputs a kernel just made, and a staged
// collective on a capturing stream.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "dist_checks.hpp"
#include "dist_fp8_checks.hpp"
#include "dist_mlp_checks.hpp"
#include "dist_support.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"
#include "tapegrad/tensor/gpu/device.hpp"
#include "tapegrad/tensor/gpu/graph.hpp"
#include "tapegrad/tensor/gpu/memory.hpp"

TYPE_TO_STRING(tapegrad::f8e4m3);
TYPE_TO_STRING(tapegrad::f8e5m2);

using namespace tapegrad;

namespace {

// How a run's ranks sit on the GPUs: rank r on cuda:(r % gpus).
struct Placement {
  int ranks, gpus;
};

// The placements to run: over NCCL one rank, and one rank a GPU when there are several; then two ranks sharing
// cuda:0, staged through host memory.
std::vector<Placement> placements() {
  std::vector<Placement> all;
  if (dist::has_nccl()) {
    all.push_back({1, 1});
    if (cuda::device_count() >= 2) all.push_back({cuda::device_count(), cuda::device_count()});
  } else {
    MESSAGE("tapegrad was built without NCCL: only the runs of two ranks sharing cuda:0 (staged through host "
            "memory)");
  }
  all.push_back({2, 1});
  return all;
}

Device device_of(const dist::Communicator& comm, const Placement& placement) {
  return Device::cuda(comm.rank() % placement.gpus);
}

// |sharded - unsharded| on a GPU: the ranks' partial products summed in another order, and products that
// accumulate in another order for another F.
template <class T> test::Tolerance gpu_sharding_tolerance() {
  return std::is_same_v<T, float> ? test::Tolerance{2e-5, 2e-5, true} : test::Tolerance{2e-2, 2e-2, true};
}

TEST_CASE_TEMPLATE("every collective runs on GPUs in every dtype", T, DIST_DTYPES) {
  for (const Placement& placement : placements()) {
    CAPTURE(placement.ranks);
    test::on_threads(placement.ranks, [&](const dist::Communicator& comm) {
      test::check_collectives<T>(comm, device_of(comm, placement));
    });
  }
}

// Each collective's input made by a kernel queued just before it, which nothing waits for (x · 2): a transport that
// read its input before the stream got there (a staged copy, all_reduce_start's side stream) would see other values.
TEST_CASE("GPU collectives read the input that the kernel just before them wrote") {
  for (const Placement& placement : placements()) {
    CAPTURE(placement.ranks);
    test::on_threads(placement.ranks, [&](const dist::Communicator& comm) {
      const int p = comm.size();
      const std::int64_t block = std::int64_t{1} << 18, n = p * block;  // (large: the kernel may still be running)
      const Device device = device_of(comm, placement);
      const Var<float> x = constant(test::rank_tensor<float>(Shape{p, block}, comm.rank(), device));
      const auto doubled = [&] { return eval(x * 2.0).value(); };
      const auto twice = [](int rank, std::int64_t i) { return 2 * test::value_at<float>(rank, i); };
      const auto sum = [&](std::int64_t i) {
        double s = 0;
        for (int r = 0; r < p; ++r) s += twice(r, i);
        return s;
      };
      const auto expect = [](const Tensor<float>& got, std::int64_t count, const auto& want) {
        std::vector<float> values;
        for (std::int64_t i = 0; i < count; ++i) values.push_back(static_cast<float>(want(i)));
        CHECK(got.to(Device::cpu()).to_vector() == values);
      };
      expect(comm.all_reduce(doubled()), n, sum);
      Tensor<float> started = doubled();
      comm.all_reduce_start(started).wait();
      expect(started, n, sum);
      expect(comm.all_gather(doubled()), p * n,
             [&](std::int64_t i) { return twice(static_cast<int>(i / n), i % n); });
      expect(comm.reduce_scatter(doubled()), block, [&](std::int64_t i) { return sum(comm.rank() * block + i); });
      expect(comm.broadcast(doubled(), p - 1), n, [&](std::int64_t i) { return twice(p - 1, i); });
    });
  }
}

// A staged collective cannot be captured in a CUDA graph (it waits for the device): the capturing rank throws saying
// so, and its failure fails the group, so that the other rank's collective throws at once with that cause instead of
// waiting for the timeout, and neither rank can use the communicator again. Each rank on a stream of its own (two
// ranks on one GPU otherwise share tapegrad's, and one's capture would take in the other's work).
TEST_CASE("a staged collective on a capturing stream fails every rank at once, naming the capture") {
  const std::chrono::seconds timeout(60);
  test::on_threads(
      2,
      [&](const dist::Communicator& comm) {
        cudaStream_t mine = nullptr;
        REQUIRE(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking) == cudaSuccess);
        {
          const cuda::StreamGuard guard(mine, 0);
          Tensor<float> x = test::rank_tensor<float>(Shape{4}, comm.rank(), Device::cuda(0));
          comm.all_reduce_in_place(x);  // (makes the link: staged)
          const auto start = std::chrono::steady_clock::now();
          std::string error;
          try {
            if (comm.rank() == 1) {
              cuda::Graph::capture(0, [&] { comm.all_reduce_in_place(x); });
            } else {
              comm.all_reduce_in_place(x);
            }
          } catch (const Error& e) {
            error = e.what();
          }
          CHECK(std::chrono::steady_clock::now() - start < timeout / 2);
          CHECK(error.find("staged through host memory) cannot be captured in a CUDA graph") != std::string::npos);
          if (comm.rank() == 0) {
            CHECK(error.find("all_reduce: rank 1 failed: all_reduce: dist: ") != std::string::npos);
          }
          CHECK_THROWS_WITH_AS(comm.barrier(), doctest::Contains("the communicator cannot be used again"),
                               dist::CommunicationError);
        }
        cudaStreamDestroy(mine);
      },
      timeout);
}

// body(communicator of rank r, seed, its device) on one thread a rank, for each placement; the seed fresh and shared.
template <class Body> void on_gpu_ranks(Body body) {
  const std::uint64_t seed = test::fresh_seed();
  MESSAGE("seed ", seed);
  for (const Placement& placement : placements()) {
    CAPTURE(placement.ranks);
    test::on_threads(placement.ranks,
                     [&](const dist::Communicator& comm) { body(comm, seed, device_of(comm, placement)); });
  }
}

TEST_CASE_TEMPLATE("the tensor-parallel node on GPUs equals the unsharded one", T, float, tapegrad::bf16) {
  on_gpu_ranks([](const dist::Communicator& comm, std::uint64_t seed, Device device) {
    mlp_test::check_sharded_cases<T>(comm, seed, device, gpu_sharding_tolerance<T>());
  });
}

// The fp8 node on GPUs, its amaxes reduced over the ranks (delayed scaling's gathered at each pass's end, current
// scaling's before each sharded tensor's scale): within the fp8 tests' bounds of the unsharded node, delayed scaling's
// histories the same on every rank and the unsharded run's.
TEST_CASE("the tensor-parallel fp8 node on GPUs equals the unsharded one for every recipe") {
  on_gpu_ranks([](const dist::Communicator& comm, std::uint64_t seed, Device device) {
    mlp_test::check_sharded_fp8_cases<float>(
        comm, seed, device,
        [](const Tensor<float>& got, const Tensor<double>& want, double bound) {
          CHECK(test::relative_error(got, want) <= bound);
        },
        1e-4);
  });
}

TEST_CASE("data-parallel training on GPUs equals one GPU on the whole batch") {
  const std::uint64_t seed = test::fresh_seed();
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
  for (const Placement& placement : placements()) {
    const int ranks = placement.ranks;
    CAPTURE(ranks);
    test::on_threads(ranks, [&](const dist::Communicator& comm) {
      const Device device = device_of(comm, placement);
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

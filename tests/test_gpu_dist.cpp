// dist::Communicator on CUDA tensors (NCCL) and layernorm_mlp's tensor parallelism on the GPU. One GPU: one rank,
// the same code path (NCCL with one rank, the node's collectives and side stream). Several GPUs: one rank a GPU,
// each on its own thread; skipped (with a message) when fewer than two are visible.
#include <doctest/doctest.h>

#include <random>

#include "dist_checks.hpp"
#include "dist_mlp_checks.hpp"
#include "dist_support.hpp"
#include "support.hpp"
#include "tapegrad/tensor/gpu/device.hpp"

TYPE_TO_STRING(tapegrad::f8e4m3);
TYPE_TO_STRING(tapegrad::f8e5m2);

using namespace tapegrad;

namespace {

// The rank counts to run: one, and every GPU when there are several.
std::vector<int> rank_counts() {
  std::vector<int> counts{1};
  if (cuda::device_count() >= 2) {
    counts.push_back(cuda::device_count());
  } else {
    MESSAGE("one GPU visible: the tests of several ranks (one a GPU) are skipped");
  }
  return counts;
}

// |sharded - unsharded| on a GPU: the ranks' partial products summed in another order, and products that
// accumulate in another order for another F.
template <class T> test::Tolerance gpu_sharding_tolerance() {
  return std::is_same_v<T, float> ? test::Tolerance{2e-5, 2e-5, true} : test::Tolerance{2e-2, 2e-2, true};
}

TEST_CASE_TEMPLATE("NCCL runs every collective in every dtype, one rank a GPU", T, DIST_DTYPES) {
  if (!dist::has_nccl()) {
    MESSAGE("tapegrad was built without NCCL");
    return;
  }
  for (int ranks : rank_counts()) {
    CAPTURE(ranks);
    test::on_threads(ranks, [](const dist::Communicator& comm) {
      test::check_collectives<T>(comm, Device::cuda(comm.rank()));
    });
  }
}

TEST_CASE_TEMPLATE("the tensor-parallel node on GPUs equals the unsharded one", T, float, tapegrad::bf16) {
  if (!dist::has_nccl()) return;
  const std::uint64_t seed = std::random_device{}();
  MESSAGE("seed ", seed);
  for (int ranks : rank_counts()) {
    CAPTURE(ranks);
    test::on_threads(ranks, [&](const dist::Communicator& comm) {
      mlp_test::check_sharded_cases<T>(comm, seed, Device::cuda(comm.rank()), gpu_sharding_tolerance<T>());
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

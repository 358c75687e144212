// dist::Communicator::in_process: ranks that are threads of one process (no MPI): every collective in every dtype,
// the tensor-parallel node against the unsharded one, disagreements, and a rank that never comes.
#include <doctest/doctest.h>

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

// Helpers of the tests that run under mpirun (tests/dist_main.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <random>

#include "tapegrad/tensor/dist/communicator.hpp"

namespace tapegrad::test {

// The job's communicator, with a timeout short enough that a test that went wrong fails instead of waiting.
inline dist::Communicator test_world() {
  return dist::Communicator::world({.timeout = std::chrono::seconds(60), .name = "world"});
}

// A seed drawn on rank 0 and shared: every rank makes the same "fresh random" inputs.
inline std::uint64_t shared_seed(const dist::Communicator& comm) {
  Tensor<std::int64_t> seed(Shape{1});
  seed.flat(0) = static_cast<std::int64_t>(std::random_device{}() >> 1);
  comm.broadcast_in_place(seed, 0);
  MESSAGE("seed ", seed.flat(0));
  return static_cast<std::uint64_t>(seed.flat(0));
}

}  // namespace tapegrad::test

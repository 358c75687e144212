// Helpers of the tests of tapegrad::dist: the communicator of the tests that run under mpirun (tests/dist_main.cpp),
// and ranks on threads of one process.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <random>
#include <thread>
#include <vector>

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

// Runs body(communicator of rank r) on `size` threads at once; rethrows the first rank's exception.
template <class Body> void on_threads(int size, Body body, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const auto ranks = dist::Communicator::in_process(size, {.timeout = timeout, .name = "threads"});
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(ranks[static_cast<std::size_t>(r)]);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace tapegrad::test

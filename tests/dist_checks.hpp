// The collectives' checks, on any communicator (tests/test_dist_collectives.cpp runs them over MPI,
// tests/test_dist_threads.cpp on threads of one process, tests/test_gpu_dist.cpp on CUDA tensors through NCCL).
// Every tensor is made on the cpu and moved to `device`.
#pragma once

#include <doctest/doctest.h>

#include <functional>

#include "tapegrad/tensor/dist/communicator.hpp"

namespace tapegrad::test {

#define DIST_DTYPES float, double, tapegrad::bf16, tapegrad::f16, std::int32_t, std::int64_t, tapegrad::f8e4m3, \
                    tapegrad::f8e5m2

// Element i of rank `rank`'s tensor: small integers and halves, exact in T and so are their sums (and the partial
// sums, rounded after each addition) over up to 4 ranks; fp8 (e5m2 has 2 mantissa bits) gets 0s and 1s.
template <class T> double value_at(int rank, std::int64_t i) {
  if constexpr (is_fp8_v<T>) return static_cast<double>((i + rank) % 2);
  const double whole = static_cast<double>((i + rank) % 3);
  return std::is_integral_v<T> ? whole : whole + (i % 2 ? 0.5 : 0.0);
}

template <class T> Tensor<T> rank_tensor(const Shape& shape, int rank, Device device) {
  Tensor<T> t(shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.flat(i) = convert<T>(value_at<T>(rank, i));
  return t.to(device);
}

template <class T> void check_values(const Tensor<T>& on_device, const std::function<double(std::int64_t)>& want) {
  const Tensor<T> got = on_device.to(Device::cpu());
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    INFO("element ", i);
    CHECK(convert<double>(got.flat(i)) == want(i));
  }
}

// Every rank gets the sum of all_reduce.
template <class T> void check_all_reduce(const dist::Communicator& world, Device device) {
  const int p = world.size();
  auto want = [&](std::int64_t i) {
    double sum = 0;
    for (int r = 0; r < p; ++r) sum += value_at<T>(r, i);
    return sum;
  };
  const Tensor<T> x = rank_tensor<T>(Shape{5, 3}, world.rank(), device);
  const Tensor<T> sum = world.all_reduce(x);
  CHECK(sum.shape() == x.shape());
  CHECK(sum.device() == device);
  check_values(sum, want);
  CHECK(!sum.shares_storage_with(x));
  Tensor<T> in_place = x.clone();
  world.all_reduce_in_place(in_place);
  check_values(in_place, want);
  check_values(world.all_reduce(rank_tensor<T>(Shape{}, world.rank(), device)), want);  // a scalar
}

// all_gather stacks the ranks' tensors along the first axis in rank order.
template <class T> void check_all_gather(const dist::Communicator& world, Device device) {
  const int p = world.size();
  const Tensor<T> gathered = world.all_gather(rank_tensor<T>(Shape{2, 3}, world.rank(), device));
  CHECK(gathered.shape() == Shape{2 * p, 3});
  check_values(gathered, [](std::int64_t i) { return value_at<T>(static_cast<int>(i / 6), i % 6); });
  CHECK(world.all_gather(rank_tensor<T>(Shape{}, world.rank(), device)).shape() == Shape{p});
}

// reduce_scatter leaves each rank the sum of its block of rows.
template <class T> void check_reduce_scatter(const dist::Communicator& world, Device device) {
  const int p = world.size(), r = world.rank();
  const Tensor<T> part = world.reduce_scatter(rank_tensor<T>(Shape{2 * p, 3}, r, device));
  CHECK(part.shape() == Shape{2, 3});
  check_values(part, [&](std::int64_t i) {
    double sum = 0;
    for (int q = 0; q < p; ++q) sum += value_at<T>(q, r * 6 + i);
    return sum;
  });
}

// broadcast gives every rank the root's tensor.
template <class T> void check_broadcast(const dist::Communicator& world, Device device) {
  const int root = world.size() - 1;
  const auto want = [&](std::int64_t i) { return value_at<T>(root, i); };
  check_values(world.broadcast(rank_tensor<T>(Shape{4, 2}, world.rank(), device), root), want);
  Tensor<T> t = rank_tensor<T>(Shape{4, 2}, world.rank(), device);
  world.broadcast_in_place(t, root);
  check_values(t, want);
}

// Every collective in dtype T.
template <class T> void check_collectives(const dist::Communicator& world, Device device = Device::cpu()) {
  check_all_reduce<T>(world, device);
  check_all_gather<T>(world, device);
  check_reduce_scatter<T>(world, device);
  check_broadcast<T>(world, device);
}

}  // namespace tapegrad::test

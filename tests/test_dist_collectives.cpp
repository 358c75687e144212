// dist::Communicator's collectives on CPU tensors, run under mpirun with 1, 2 and 4 ranks: every collective in every
// dtype, splits, and the errors every rank gets when the ranks disagree (instead of a hang).
#include <doctest/doctest.h>

#include <functional>
#include <string>

#include "dist_support.hpp"
#include "support.hpp"
#include "tapegrad/tensor/dist/communicator.hpp"

TYPE_TO_STRING(tapegrad::f8e4m3);
TYPE_TO_STRING(tapegrad::f8e5m2);

namespace tapegrad {
namespace {

using test::test_world;

// Element i of rank `rank`'s tensor: small integers and halves, exact in T and so are their sums (and the partial
// sums, rounded after each addition) over up to 4 ranks; fp8 (e5m2 has 2 mantissa bits) gets 0s and 1s.
template <class T> double value_at(int rank, std::int64_t i) {
  if constexpr (is_fp8_v<T>) return static_cast<double>((i + rank) % 2);
  const double whole = static_cast<double>((i + rank) % 3);
  return std::is_integral_v<T> ? whole : whole + (i % 2 ? 0.5 : 0.0);
}

template <class T> Tensor<T> rank_tensor(const Shape& shape, int rank) {
  Tensor<T> t(shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.flat(i) = convert<T>(value_at<T>(rank, i));
  return t;
}

template <class T> void check_values(const Tensor<T>& got, const std::function<double(std::int64_t)>& want) {
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    INFO("element ", i);
    CHECK(convert<double>(got.flat(i)) == want(i));
  }
}

#define DIST_DTYPES float, double, tapegrad::bf16, tapegrad::f16, std::int32_t, std::int64_t, tapegrad::f8e4m3, \
                    tapegrad::f8e5m2

TEST_CASE_TEMPLATE("every rank gets the sum of all_reduce", T, DIST_DTYPES) {
  const auto world = test_world();
  const int p = world.size();
  auto want = [&](std::int64_t i) {
    double sum = 0;
    for (int r = 0; r < p; ++r) sum += value_at<T>(r, i);
    return sum;
  };
  const Tensor<T> x = rank_tensor<T>(Shape{5, 3}, world.rank());
  const Tensor<T> sum = world.all_reduce(x);
  CHECK(sum.shape() == x.shape());
  check_values(sum, want);
  CHECK(!sum.shares_storage_with(x));
  Tensor<T> in_place = x.clone();
  world.all_reduce_in_place(in_place);
  check_values(in_place, want);
  check_values(world.all_reduce(rank_tensor<T>(Shape{}, world.rank())), want);  // a scalar
}

TEST_CASE_TEMPLATE("all_gather stacks the ranks' tensors along the first axis in rank order", T, DIST_DTYPES) {
  const auto world = test_world();
  const int p = world.size();
  const Tensor<T> gathered = world.all_gather(rank_tensor<T>(Shape{2, 3}, world.rank()));
  CHECK(gathered.shape() == Shape{2 * p, 3});
  check_values(gathered, [](std::int64_t i) { return value_at<T>(static_cast<int>(i / 6), i % 6); });
  CHECK(world.all_gather(rank_tensor<T>(Shape{}, world.rank())).shape() == Shape{p});
}

TEST_CASE_TEMPLATE("reduce_scatter leaves each rank the sum of its block of rows", T, DIST_DTYPES) {
  const auto world = test_world();
  const int p = world.size(), r = world.rank();
  const Tensor<T> part = world.reduce_scatter(rank_tensor<T>(Shape{2 * p, 3}, r));
  CHECK(part.shape() == Shape{2, 3});
  check_values(part, [&](std::int64_t i) {
    double sum = 0;
    for (int q = 0; q < p; ++q) sum += value_at<T>(q, r * 6 + i);
    return sum;
  });
}

TEST_CASE_TEMPLATE("broadcast gives every rank the root's tensor", T, DIST_DTYPES) {
  const auto world = test_world();
  const int root = world.size() - 1;
  const auto want = [&](std::int64_t i) { return value_at<T>(root, i); };
  check_values(world.broadcast(rank_tensor<T>(Shape{4, 2}, world.rank()), root), want);
  Tensor<T> t = rank_tensor<T>(Shape{4, 2}, world.rank());
  world.broadcast_in_place(t, root);
  check_values(t, want);
}

TEST_CASE("split makes communicators of the ranks of one color, ordered by key") {
  const auto world = test_world();
  const int r = world.rank(), p = world.size();
  // Colors: even and odd ranks; keys reverse the order.
  const auto half = world.split(r % 2, -r, "parity");
  CHECK(half.name() == "parity");
  CHECK(half.size() == (p + 1 - r % 2) / 2);
  CHECK(half.rank() == (half.size() - 1 - r / 2));
  Tensor<double> mine(Shape{1});
  mine.flat(0) = r;
  double want = 0;
  for (int q = r % 2; q < p; q += 2) want += q;
  CHECK(half.all_reduce(mine).flat(0) == want);
  half.barrier();
  world.barrier();
}

// Every rank throws the same Error, and the communicator stays usable.
void check_every_rank_throws(const dist::Communicator& world, const std::function<void()>& call,
                             const std::string& expected) {
  std::string message;
  try {
    call();
  } catch (const dist::CommunicationError& e) {
    FAIL("a disagreement must not break the communicator: ", e.what());
  } catch (const Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find(expected) != std::string::npos);
  Tensor<float> one(Shape{1});
  one.flat(0) = 1;
  CHECK(world.all_reduce(one).flat(0) == static_cast<float>(world.size()));
}

TEST_CASE("ranks that call a collective differently all get an error naming each rank's call") {
  const auto world = test_world();
  const int r = world.rank();
  if (world.size() == 1) return;
  check_every_rank_throws(world, [&] { world.all_reduce(Tensor<float>(Shape{2, r + 1})); },
                          "rank 0: all_reduce (call 0) of f32 [2, 1] on cpu; rank 1: all_reduce (call 0) of f32 [2, 2]");
  check_every_rank_throws(
      world,
      [&] {
        if (r == 0) world.all_reduce(Tensor<double>(Shape{3}));
        else world.all_reduce(Tensor<float>(Shape{3}));
      },
      "of f64 [3] on cpu");
  check_every_rank_throws(
      world,
      [&] {
        if (r == 0) world.all_gather(Tensor<float>(Shape{3}));
        else world.barrier();
      },
      "rank 0: all_gather");
  check_every_rank_throws(world, [&] { world.all_reduce(r == 1 ? Tensor<float>() : Tensor<float>(Shape{3})); },
                          "rank 1: all_reduce (call 6) of an undefined tensor");
  check_every_rank_throws(world, [&] { world.broadcast(Tensor<float>(Shape{3}), r); }, "from root 1");
}

TEST_CASE("arguments every rank gets wrong throw on every rank") {
  const auto world = test_world();
  const int p = world.size();
  // (one rank splits any first axis: it gets a scalar, which has none)
  const Shape unsplittable = p == 1 ? Shape{} : Shape{2 * p + 1, 2};
  check_every_rank_throws(world, [&] { world.reduce_scatter(Tensor<float>(unsplittable)); },
                          "must split into " + std::to_string(p) + " equal blocks");
  check_every_rank_throws(world, [&] { world.broadcast(Tensor<float>(Shape{2}), p); },
                          "root " + std::to_string(p) + " is not a rank of communicator 'world'");
  check_every_rank_throws(world, [&] { world.all_reduce(Tensor<float>()); }, "passed an undefined tensor");
}

}  // namespace
}  // namespace tapegrad

// dist::Communicator's collectives on CPU tensors, run under mpirun with 1, 2 and 4 ranks: every collective in every
// dtype, splits, and the errors every rank gets when the ranks disagree (instead of a hang).
#include <doctest/doctest.h>

#include <functional>
#include <string>

#include "dist_checks.hpp"
#include "dist_support.hpp"
#include "support.hpp"
#include "tapegrad/tensor/dist/communicator.hpp"

TYPE_TO_STRING(tapegrad::f8e4m3);
TYPE_TO_STRING(tapegrad::f8e5m2);

namespace tapegrad {
namespace {

using test::test_world;

TEST_CASE_TEMPLATE("every collective gives every rank the right values", T, DIST_DTYPES) {
  test::check_collectives<T>(test_world());
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

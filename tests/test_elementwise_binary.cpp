// Every binary elementwise op in every dtype and broadcasting plan against a double reference, and gradcheck.
// One heavy translation unit apiece (beside test_elementwise.cpp), so that they build in parallel.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "elementwise_checks.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::Domain;

namespace cases {
BINARY_CASE(Add, Domain::any, Domain::any, x + y, x + y)
BINARY_CASE(Sub, Domain::any, Domain::any, x - y, x - y)
BINARY_CASE(Mul, Domain::any, Domain::any, x * y, x * y)
BINARY_CASE(Div, Domain::any, Domain::away_from_zero, x / y, x / y)
BINARY_CASE(Pow, Domain::positive, Domain::any, pow(x, y), std::pow(x, y))
}  // namespace cases

namespace {

// Operand shapes covering every broadcasting plan: flat, broadcast (merged to rank <= 4) and expand (more than
// four merged axes), with rank-0 operands, both sides broadcasting, and a case large enough for the thread pool.
const std::vector<std::pair<Shape, Shape>> binary_shapes{
    {{3, 4}, {3, 4}},                          // flat
    {{}, {}},                                  // flat, rank 0
    {{3, 1}, {1, 4}},                          // both sides broadcast
    {{}, {2, 3}},                              // rank-0 operand
    {{2, 3}, {}},                              //
    {{5}, {2, 3, 5}},                          // ranks differ
    {{2, 1, 3}, {4, 1}},                       //
    {{3, 1, 1, 5}, {1, 4, 2, 1}},              // merges to three axes
    {{2, 1, 2, 1, 2, 1}, {1, 2, 1, 2, 1, 2}},  // six merged axes: the expand fallback
    {{64, 1, 33}, {1, 40, 33}},                // large: on the thread pool
};

}  // namespace

TEST_CASE_TEMPLATE("binary elementwise ops broadcast and match a double reference, forward and backward", T, double,
                   float, bf16, f16) {
  test::for_each_case<cases::Add, cases::Sub, cases::Mul, cases::Div, cases::Pow>([&]<class Case>() {
    std::uint64_t seed = 200;
    for (const auto& [x, y] : binary_shapes) test::check_binary<Case, T>(x, y, seed += 10);
  });
}

// Every unary elementwise op in every dtype against a double reference, forward and backward, and gradcheck.
// One heavy translation unit apiece (beside test_elementwise.cpp), so that they build in parallel.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "elementwise_checks.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::Domain;

namespace cases {
UNARY_CASE(Negate, Domain::any, -x, -x)
UNARY_CASE(Neg, Domain::any, neg(x), -x)
UNARY_CASE(Exp, Domain::any, exp(x), std::exp(x))
UNARY_CASE(Log, Domain::positive, log(x), std::log(x))
UNARY_CASE(Sqrt, Domain::positive, sqrt(x), std::sqrt(x))
UNARY_CASE(Rsqrt, Domain::positive, rsqrt(x), 1 / std::sqrt(x))
UNARY_CASE(Square, Domain::any, square(x), x * x)
UNARY_CASE(Abs, Domain::away_from_zero, abs(x), std::abs(x))
UNARY_CASE(PowHalves, Domain::positive, pow(x, 2.5), std::pow(x, 2.5))
UNARY_CASE(PowInteger, Domain::any, pow(x, 3), x * x * x)
UNARY_CASE(PowNegative, Domain::positive, pow(x, -1.5), std::pow(x, -1.5))
UNARY_CASE(PlusScalar, Domain::any, x + 2, x + 2)
UNARY_CASE(ScalarPlus, Domain::any, 2 + x, 2 + x)
UNARY_CASE(MinusScalar, Domain::any, x - 2, x - 2)
UNARY_CASE(ScalarMinus, Domain::any, 2 - x, 2 - x)
UNARY_CASE(TimesScalar, Domain::any, x * 2, x * 2)
UNARY_CASE(ScalarTimes, Domain::any, 2.5f * x, 2.5 * x)
UNARY_CASE(OverScalar, Domain::any, x / 3, x / 3)
UNARY_CASE(ScalarOver, Domain::away_from_zero, 3 / x, 3 / x)

}  // namespace cases

namespace {

// Odd and small shapes, rank 0 to 3, and one large enough to run on the thread pool.
const std::vector<Shape> unary_shapes{{}, {7}, {3, 5}, {2, 3, 4}, {129, 67}};

}  // namespace

TEST_CASE_TEMPLATE("unary elementwise ops match a double reference, forward and backward", T, double, float, bf16,
                   f16) {
  test::for_each_case<cases::Negate, cases::Neg, cases::Exp, cases::Log, cases::Sqrt, cases::Rsqrt, cases::Square,
                      cases::Abs, cases::PowHalves, cases::PowInteger, cases::PowNegative, cases::PlusScalar,
                      cases::ScalarPlus, cases::MinusScalar, cases::ScalarMinus, cases::TimesScalar,
                      cases::ScalarTimes, cases::OverScalar, cases::ScalarOver>([&]<class Case>() {
    std::uint64_t seed = 100;
    for (const Shape& shape : unary_shapes) test::check_unary<Case, T>(shape, seed += 10);
  });
}

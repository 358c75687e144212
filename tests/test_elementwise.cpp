#include <doctest/doctest.h>

#include "tapegrad.hpp"

using namespace tapegrad;

TEST_CASE("a * b + exp(c) records one node and passes gradcheck") {
  Tape tape;
  TapeScope scope(tape);
  auto a = param(randn<double>({3, 4}, 1)), b = param(randn<double>({3, 4}, 2)), c = param(randn<double>({4}, 3));
  Var<double> y = a * b + exp(c);
  CHECK(tape.size() == 1);
  CHECK(gradcheck([](const std::vector<Var<double>>& in) -> Var<double> { return in[0] * in[1] + exp(in[2]); },
                  {a.value(), b.value(), c.value()}));
}

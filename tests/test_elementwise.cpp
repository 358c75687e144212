#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "elementwise_checks.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::check_close;
using test::exact;
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

BINARY_CASE(Add, Domain::any, Domain::any, x + y, x + y)
BINARY_CASE(Sub, Domain::any, Domain::any, x - y, x - y)
BINARY_CASE(Mul, Domain::any, Domain::any, x * y, x * y)
BINARY_CASE(Div, Domain::any, Domain::away_from_zero, x / y, x / y)
BINARY_CASE(Pow, Domain::positive, Domain::any, pow(x, y), std::pow(x, y))
}  // namespace cases

namespace {

// Odd and small shapes, rank 0 to 3, and one large enough to run on the thread pool.
const std::vector<Shape> unary_shapes{{}, {7}, {3, 5}, {2, 3, 4}, {129, 67}};

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

TEST_CASE_TEMPLATE("binary elementwise ops broadcast and match a double reference, forward and backward", T, double,
                   float, bf16, f16) {
  test::for_each_case<cases::Add, cases::Sub, cases::Mul, cases::Div, cases::Pow>([&]<class Case>() {
    std::uint64_t seed = 200;
    for (const auto& [x, y] : binary_shapes) test::check_binary<Case, T>(x, y, seed += 10);
  });
}

TEST_CASE("the broadcast plan merges axes and falls back to expanding beyond four") {
  CHECK(plan_broadcast({{3, 4}, {3, 4}}, "op").kind == BroadcastPlan::Kind::flat);
  CHECK(plan_broadcast({{}, {}}, "op").kind == BroadcastPlan::Kind::flat);
  const BroadcastPlan both = plan_broadcast({{3, 1}, {1, 4}}, "op");
  CHECK(both.kind == BroadcastPlan::Kind::broadcast);
  CHECK(both.output == Shape{3, 4});
  CHECK(plan_broadcast({{3, 1, 1, 5}, {1, 4, 2, 1}}, "op").kind == BroadcastPlan::Kind::broadcast);
  CHECK(plan_broadcast({{2, 1, 2, 1, 2, 1}, {1, 2, 1, 2, 1, 2}}, "op").kind == BroadcastPlan::Kind::expand);
  CHECK_THROWS_WITH_AS(plan_broadcast({{2, 3}, {4, 3}}, "op"),
                       "op: shapes [2, 3] and [4, 3] cannot be broadcast together", Error);
}

TEST_CASE("three operands with mixed broadcasting pass gradcheck") {
  const auto f = [](const std::vector<Var<double>>& in) -> Var<double> { return in[0] * in[1] + exp(in[2]) / in[0]; };
  CHECK(gradcheck(f, {test::sample<double>({3, 1}, 1, Domain::away_from_zero), randn<double>({1, 4}, 2),
                      randn<double>({4}, 3)}));
  // Six merged axes (expand) with a third operand broadcasting differently again.
  CHECK(gradcheck(f, {test::sample<double>({2, 1, 2, 1, 2, 1}, 4, Domain::away_from_zero),
                      randn<double>({1, 2, 1, 2, 1, 2}, 5), randn<double>({2}, 6)}));
  // ... and with a third operand of the output's shape.
  CHECK(gradcheck(f, {test::sample<double>({2, 1, 2, 1, 2, 1}, 4, Domain::away_from_zero),
                      randn<double>({1, 2, 1, 2, 1, 2}, 5), randn<double>({2, 2, 2, 2, 2, 2}, 6)}));
  // Rank 0 with rank 0, and rank 0 broadcast against a 3-d operand.
  CHECK(gradcheck(f, {test::sample<double>({}, 7, Domain::away_from_zero), randn<double>({}, 8),
                      randn<double>({}, 9)}));
  CHECK(gradcheck(f, {test::sample<double>({}, 10, Domain::away_from_zero), randn<double>({2, 3, 2}, 11),
                      randn<double>({3, 1}, 12)}));
}

TEST_CASE("empty operands give empty results and gradients") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> a = param(zeros<double>({0, 3})), b = param(randn<double>({3}, 1)), c = param(randn<double>({1, 3}, 2));
  Var<double> y = a * b + c;
  CHECK(y.shape() == Shape{0, 3});
  backward(y, zeros<double>({0, 3}));
  CHECK(a.grad().shape() == Shape{0, 3});
  check_close(b.grad(), zeros<double>({3}), exact);
  check_close(c.grad(), zeros<double>({1, 3}), exact);
}

TEST_CASE_TEMPLATE("a fused expression in low precision follows the double result", T, float, bf16, f16) {
  const auto f = [](const auto& a, const auto& b, const auto& c) {
    return a * b + exp(c) - sigmoid(a) / (square(b) + 1.0);
  };
  const Tensor<T> a = randn<T>({5, 1, 7}, 1), b = randn<T>({1, 6, 7}, 2), c = randn<T>({7}, 3);
  const Tensor<T> dy = randn<T>({5, 6, 7}, 4);
  const test::Tolerance tol = test::tolerance<T>();
  const Var<T> y = eval(f(constant(a), constant(b), constant(c)));
  const Var<double> y_double = eval(f(constant(cast<double>(a)), constant(cast<double>(b)), constant(cast<double>(c))));
  check_close(y.value(), y_double.value(), tol);
  const auto grads = test::gradients<T>(f, dy, a, b, c);
  const auto grads_double =
      test::gradients<double>(f, cast<double>(dy), cast<double>(a), cast<double>(b), cast<double>(c));
  // The gradients of broadcast operands are sums of up to 30 terms, accumulated in f32 and rounded once.
  for (std::size_t k = 0; k < 3; ++k) {
    CAPTURE(k);
    check_close(grads[k], grads_double[k], {tol.rtol, 4 * tol.atol});
  }
}

TEST_CASE("a * b + exp(c) records one node whose gradients match the op-by-op ones") {
  const Tensor<double> av = randn<double>({3, 4}, 1), bv = randn<double>({3, 4}, 2), cv = randn<double>({4}, 3);
  const Tensor<double> dy = randn<double>({3, 4}, 4);
  Tape fused_tape, op_tape;
  Var<double> a = param(av), b = param(bv), c = param(cv);
  {
    TapeScope scope(fused_tape);
    Var<double> y = a * b + exp(c);
    CHECK(fused_tape.size() == 1);
    CHECK(fused_tape.node(0).name() == "add(mul(x0, x1), exp(x2))");
    backward(y, dy);
  }
  Var<double> a2 = param(av), b2 = param(bv), c2 = param(cv);
  {
    TapeScope scope(op_tape);
    Var<double> y = add(mul(a2, b2), eval(exp(c2)));
    CHECK(op_tape.size() == 3);
    backward(y, dy);
  }
  check_close(a.grad(), a2.grad(), exact);
  check_close(b.grad(), b2.grad(), exact);
  check_close(c.grad(), c2.grad(), exact);
  CHECK(gradcheck([](const std::vector<Var<double>>& in) -> Var<double> { return in[0] * in[1] + exp(in[2]); },
                  {av, bv, cv}));
}

TEST_CASE("a kept expression holds its leaves after their handles are gone") {
  Tape tape;
  TapeScope scope(tape);
  const Tensor<double> av = randn<double>({3}, 1), bv = randn<double>({3}, 2);
  std::weak_ptr<VarImpl<double>> wa, wb;
  auto e = [&] {
    Var<double> a = param(av), b = param(bv);
    wa = a.slot();
    wb = b.slot();
    return a * b;
  }();
  REQUIRE_FALSE(wa.expired());  // the expression keeps both leaves alive
  REQUIRE_FALSE(wb.expired());
  Var<double> y = e;
  check_close(y.value(), eval(constant(av) * constant(bv)).value(), exact);
  backward(y, ones<double>({3}));
  const Var<double> a = Var<double>::from_slot(wa.lock()), b = Var<double>::from_slot(wb.lock());
  check_close(a.grad(), bv, exact);
  check_close(b.grad(), av, exact);
}

TEST_CASE("evaluating a kept expression twice records two nodes and accumulates both gradients") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> a = param(randn<double>({4}, 1)), b = param(randn<double>({4}, 2));
  const auto e = a * b + 1.0;
  Var<double> y1 = e;
  Var<double> y2 = e.eval();
  CHECK(tape.size() == 2);
  check_close(y1.value(), y2.value(), exact);
  backward(y1, ones<double>({4}));
  backward(y2, ones<double>({4}));
  check_close(a.grad(), eval(constant(b.value()) * 2.0).value(), exact);
  check_close(b.grad(), eval(constant(a.value()) * 2.0).value(), exact);
}

TEST_CASE("a Var used twice in one expression gets the summed gradient") {
  Tape tape;
  TapeScope scope(tape);
  const Tensor<double> av = randn<double>({5}, 1), bv = randn<double>({5}, 2);
  Var<double> a = param(av), b = param(bv);
  Var<double> y = a * a + a * b;  // dy/da = 2a + b, dy/db = a
  CHECK(tape.size() == 1);
  backward(y, ones<double>({5}));
  check_close(a.grad(), eval(constant(av) * 2.0 + constant(bv)).value(), exact);
  check_close(b.grad(), av, exact);
  CHECK(gradcheck([](const std::vector<Var<double>>& in) -> Var<double> { return in[0] * in[0] * in[0] - in[0]; },
                  {av}));
}

TEST_CASE("an expression of constants records nothing") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> y = constant(ones<double>({2})) * 3.0 + exp(constant(zeros<double>({2})));
  CHECK(tape.size() == 0);
  CHECK_FALSE(y.requires_grad());
  check_close(y.value(), full<double>({2}, 4.0), exact);
}

TEST_CASE("only the operands that require grad receive a gradient") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> p = param(randn<double>({3}, 1)), k = constant(randn<double>({3}, 2));
  backward(sum(p * k + exp(k)));
  check_close(p.grad(), k.value(), exact);
  CHECK_FALSE(k.grad().defined());
}

TEST_CASE("shapes that do not broadcast throw naming the expression and the shapes") {
  Var<double> a = param(randn<double>({2, 3}, 1)), b = param(randn<double>({4, 3}, 2));
  Var<double> c = param(randn<double>({3}, 3));
  CHECK_THROWS_WITH_AS(eval(a + b), "add(x0, x1): operand shapes [2, 3] [4, 3] cannot be broadcast together", Error);
  CHECK_THROWS_WITH_AS(eval(exp(c) * (a - b) + 1.0),
                       "add_scalar(mul(exp(x0), sub(x1, x2))): operand shapes [3] [2, 3] [4, 3] cannot be broadcast "
                       "together",
                       Error);
  CHECK_THROWS_AS(Var<double>(a / b), Error);
}

// ---- the tensor-level broadcasting helpers ----------------------------------------------------------------------

TEST_CASE("expand_to repeats along broadcast axes and sum_to undoes it for gradients") {
  const Tensor<double> t = from_vector<double>({1, 2, 3}, {3, 1});
  const Tensor<double> e = expand_to(t, {2, 3, 4});
  CHECK(e.shape() == Shape{2, 3, 4});
  for (std::int64_t i = 0; i < 2; ++i) {
    for (std::int64_t j = 0; j < 3; ++j) {
      for (std::int64_t k = 0; k < 4; ++k) CHECK(e(i, j, k) == t(j, 0));
    }
  }
  const Tensor<double> s = sum_to(e, {3, 1});
  check_close(s, eval(constant(t) * 8.0).value(), exact);
  CHECK(sum_to(e, {2, 3, 4}).shares_storage_with(e));  // nothing to reduce
  CHECK(sum_to(e, {}).item() == 48.0);
}

TEST_CASE("sum_to accumulates low precision in f32") {
  // In bf16 a running sum of ones stalls at 256; f32 accumulation reaches 1000 (which bf16 holds exactly).
  CHECK(convert<double>(sum_to(ones<bf16>({1000, 1}), {1}).flat(0)) == 1000.0);
}

TEST_CASE("expand_to and sum_to throw naming both shapes") {
  CHECK_THROWS_WITH_AS(expand_to(zeros<float>({3, 4}), {4}), "expand_to: cannot expand shape [3, 4] to [4]", Error);
  CHECK_THROWS_WITH_AS(expand_to(zeros<float>({2}), {3}),
                       "expand_to: shapes [2] and [3] cannot be broadcast together", Error);
  CHECK_THROWS_WITH_AS(sum_to(zeros<float>({4}), {3, 4}), "sum_to: cannot reduce shape [4] to [3, 4]", Error);
}

TEST_CASE("a bias's gradient is the column sums of its partner's, with the same bits on every thread count") {
  // In z + b with b broadcast along leading axes, dL/db sums dL/dz over the rows: both come from one evaluation of
  // the gradient expression (gelu_tanh's derivative included), b's summed in blocks whose order is fixed.
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(seed);
  const Tensor<double> z = randn<double>({3, 300, 130}, seed), b = randn<double>({130}, seed + 1);
  const Tensor<double> r = randn<double>({3, 300, 130}, seed + 2);
  const auto gradients = [&](int threads) {
    const test::ThreadCount scoped(threads);
    const Var<double> zv = param(z), bv = param(b);
    backward(sum(gelu_tanh(zv + bv) * constant(r)));
    return std::pair{zv.grad(), bv.grad()};
  };
  const auto [dz, db] = gradients(1);
  const auto [dz2, db2] = gradients(2);
  CHECK(test::bitwise_equal(dz, dz2));
  CHECK(test::bitwise_equal(db, db2));
  Tensor<double> column_sums = zeros<double>({130});
  for (std::int64_t i = 0; i < dz.numel(); ++i) column_sums.flat(i % 130) += dz.flat(i);
  check_close(db, column_sums, {1e-12, 1e-12});
}

TEST_CASE_TEMPLATE("exp, log, tanh, sigmoid, rsqrt and the activations give an element the same bits alone as in a "
                   "vectorized loop",
                   T, float, double) {
  // A one-element tensor runs Eigen's scalar path, a 64-element one its packets: they must agree, or an element's
  // bits would depend on whether it falls in a loop's tail, which depends on the thread count.
  const std::uint64_t seed = std::random_device{}();
  CAPTURE(seed);
  const Tensor<T> x = rand_uniform<T>({64}, seed, 0.05, 4.0);
  const auto each = [](const Var<T>& v) {
    return std::vector<Var<T>>{exp(v), log(v), tanh(v - 2.0), sigmoid(v - 2.0), rsqrt(v), gelu_tanh(v - 2.0),
                               silu(v - 2.0)};
  };
  const NoGradGuard no_grad;
  const std::vector<Var<T>> whole = each(constant(x));
  for (std::int64_t k = 0; k < x.numel(); ++k) {
    const std::vector<Var<T>> alone = each(constant(full<T>({1}, x.flat(k))));
    for (std::size_t f = 0; f < whole.size(); ++f) {
      CAPTURE(k);
      CAPTURE(f);
      CHECK(test::bitwise_equal(alone[f].value(), full<T>({1}, whole[f].value().flat(k))));
    }
  }
}

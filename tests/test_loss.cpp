#include <doctest/doctest.h>

#include <cmath>

#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::Tolerance;

namespace {

Tensor<std::int64_t> labels_for(const Shape& logits, std::uint64_t seed) {
  const auto leading = logits.to_vector();
  return rand_int<std::int64_t>(Shape(std::vector<std::int64_t>(leading.begin(), leading.end() - 1)), seed, 0,
                                logits.dim(-1));
}

// Rows of a distribution over the last axis.
Tensor<double> probabilities(const Shape& shape, std::uint64_t seed) {
  return softmax(constant(randn<double>(shape, seed))).value();
}

Tensor<double> scalar(double v) { return full<double>({}, v); }

// The textbook formulas in double. q(r, c) is the target probability of class c in row r.
template <class Q> Tensor<double> reference_cross_entropy(const Tensor<double>& x, Q q) {
  const std::int64_t C = x.dim(-1), rows = x.numel() / C;
  double total = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (std::int64_t c = 0; c < C; ++c) sum += std::exp(x.flat(r * C + c));
    for (std::int64_t c = 0; c < C; ++c) total += q(r, c) * (std::log(sum) - x.flat(r * C + c));
  }
  return scalar(total / double(rows));
}
Tensor<double> reference_cross_entropy(const Tensor<double>& x, const Tensor<std::int64_t>& labels) {
  return reference_cross_entropy(x, [&](std::int64_t r, std::int64_t c) { return labels.flat(r) == c ? 1.0 : 0.0; });
}
Tensor<double> reference_cross_entropy(const Tensor<double>& x, const Tensor<double>& probs) {
  const std::int64_t C = x.dim(-1);
  return reference_cross_entropy(x, [&](std::int64_t r, std::int64_t c) { return probs.flat(r * C + c); });
}
Tensor<double> reference_mse(const Tensor<double>& p, const Tensor<double>& t) {
  double total = 0.0;
  for (std::int64_t i = 0; i < p.numel(); ++i) total += std::pow(p.flat(i) - t.flat(i), 2);
  return scalar(total / double(p.numel()));
}

const Shape shapes[] = {{5}, {4, 6}, {2, 3, 5}};

// The loss value against the double reference on the same rounded inputs: its rounding (half an ulp: 2⁻²⁴, 2⁻⁹,
// 2⁻¹² relative) plus f32 sums over up to 64·300 terms.
template <class T> constexpr Tolerance forward_tolerance{};
template <> constexpr Tolerance forward_tolerance<float>{1e-5, 1e-7};
template <> constexpr Tolerance forward_tolerance<bf16>{8e-3, 1e-7};
template <> constexpr Tolerance forward_tolerance<f16>{1.5e-3, 1e-7};
// Gradients against the double backward: the same rounding of values of size 1/N (or 1/numel), with f16
// subnormals below 6e-5 (hence its atol). Where (p - q)/N cancels, what is left is the rounding of p itself: in f32
// up to 6e-8 · 1/N, 1e-9 for N = 64 rows (measured 2.2e-10 on a [64, 300] soft cross-entropy).
template <class T> constexpr Tolerance backward_tolerance{};
template <> constexpr Tolerance backward_tolerance<float>{1e-5, 1e-9};
template <> constexpr Tolerance backward_tolerance<bf16>{8e-3, 1e-10};
template <> constexpr Tolerance backward_tolerance<f16>{1.5e-3, 1e-7};

template <class T> struct Pair { Tensor<T> a, b; };
// The loss and the gradients of f(a, b) for the seed dL, in T.
template <class T, class F>
std::pair<Tensor<T>, Pair<T>> run(F f, const Tensor<T>& a, const Tensor<T>& b, double dL = 1.0) {
  auto va = param(a), vb = param(b);
  const Var<T> loss = f(va, vb);
  backward(loss, full<T>({}, dL));
  return {loss.value(), {va.grad(), vb.grad()}};
}

}  // namespace

TEST_CASE("mse_loss matches the mean of squared differences and passes gradcheck for both inputs") {
  for (const Shape& shape : {Shape{}, Shape{7}, Shape{3, 4}, Shape{2, 3, 5}}) {
    CAPTURE(shape);
    const Tensor<double> p = randn<double>(shape, 1), t = randn<double>(shape, 2);
    test::check_close(mse_loss(constant(p), constant(t)).value(), reference_mse(p, t), {1e-14, 1e-15});
    CHECK(gradcheck([](const std::vector<Var<double>>& v) { return mse_loss(v[0], v[1]); }, {p, t}));
  }
}

TEST_CASE("mse_loss sends a gradient to the target only when it requires grad, and takes expressions") {
  auto p = param(randn<double>({3, 4}, 3));
  const auto t = constant(randn<double>({3, 4}, 4));
  backward(mse_loss(p * 1.0, t));
  CHECK(p.grad().shape() == Shape{3, 4});
  CHECK_FALSE(t.grad().defined());
}

TEST_CASE("cross_entropy with labels matches -mean log_softmax[label] and passes gradcheck") {
  for (const Shape& shape : shapes) {
    CAPTURE(shape);
    const Tensor<double> x = randn<double>(shape, 5, 0.0, 2.0);
    const Tensor<std::int64_t> labels = labels_for(shape, 6);
    {
      Tape tape;
      TapeScope scope(tape);
      const Var<double> loss = cross_entropy(param(x), labels);
      CHECK(tape.size() == 1);
      CHECK(loss.shape() == Shape{});
      test::check_close(loss.value(), reference_cross_entropy(x, labels), {1e-13, 1e-15});
    }
    CHECK(gradcheck([&](const std::vector<Var<double>>& v) { return cross_entropy(v[0], labels); }, {x}));
  }
}

TEST_CASE("cross_entropy's gradient is (softmax - onehot) / N") {
  const Tensor<double> x = randn<double>({4, 6}, 7);
  const Tensor<std::int64_t> labels = labels_for({4, 6}, 8);
  auto logits = param(x);
  backward(cross_entropy(logits, labels), scalar(3.0));
  Tensor<double> want = softmax(constant(x)).value().clone();
  for (std::int64_t r = 0; r < 4; ++r) {
    want(r, labels.flat(r)) -= 1.0;
    for (std::int64_t c = 0; c < 6; ++c) want(r, c) *= 3.0 / 4.0;
  }
  test::check_close(logits.grad(), want, {1e-14, 1e-15});
}

TEST_CASE(
    "cross_entropy with soft targets matches the formula, passes gradcheck for both, and equals labels when one-hot") {
  for (const Shape& shape : shapes) {
    CAPTURE(shape);
    const Tensor<double> x = randn<double>(shape, 9, 0.0, 2.0), q = probabilities(shape, 10);
    test::check_close(cross_entropy(constant(x), constant(q)).value(), reference_cross_entropy(x, q), {1e-13, 1e-15});
    CHECK(gradcheck([](const std::vector<Var<double>>& v) { return cross_entropy(v[0], v[1]); }, {x, q}));
  }
  const Tensor<double> x = randn<double>({2, 3, 5}, 11);
  const Tensor<std::int64_t> labels = labels_for({2, 3, 5}, 12);
  Tensor<double> onehot = zeros<double>({2, 3, 5});
  for (std::int64_t r = 0; r < 6; ++r) onehot.flat(r * 5 + labels.flat(r)) = 1.0;
  const auto soft = run<double>([&](auto& a, auto& b) { return cross_entropy(a * 1.0, b); }, x, onehot);
  const auto hard = run<double>([&](auto& a, auto&) { return cross_entropy(a, labels); }, x, onehot);
  test::check_close(soft.first, hard.first, {1e-15, 0});
  test::check_close(soft.second.a, hard.second.a, {1e-15, 1e-17});
}

TEST_CASE_TEMPLATE("low-precision losses match the double reference, forward and backward", T, float, bf16, f16) {
  for (const Shape& shape : {Shape{3, 7}, Shape{2, 3, 11}, Shape{64, 300}}) {
    CAPTURE(shape);
    const Tensor<T> x = randn<T>(shape, 13, 0.0, 2.0), y = randn<T>(shape, 14);
    const Tensor<T> q = cast<T>(probabilities(shape, 15));
    const Tensor<std::int64_t> labels = labels_for(shape, 16);
    const Pair<double> in{cast<double>(x), cast<double>(y)};

    auto mse = [](auto& a, auto& b) { return mse_loss(a, b); };
    test::check_close(mse_loss(constant(x), constant(y)).value(), reference_mse(in.a, in.b), forward_tolerance<T>);
    const auto mse_grads = run<T>(mse, x, y, 0.5).second;
    const auto mse_want = run<double>(mse, in.a, in.b, 0.5);
    test::check_close(mse_grads.a, mse_want.second.a, backward_tolerance<T>);
    test::check_close(mse_grads.b, mse_want.second.b, backward_tolerance<T>);

    auto hard = [&](auto& a, auto&) { return cross_entropy(a, labels); };
    test::check_close(cross_entropy(constant(x), labels).value(), reference_cross_entropy(in.a, labels),
                      forward_tolerance<T>);
    test::check_close(run<T>(hard, x, y).second.a, run<double>(hard, in.a, in.b).second.a, backward_tolerance<T>);

    auto soft = [](auto& a, auto& b) { return cross_entropy(a, b); };
    test::check_close(cross_entropy(constant(x), constant(q)).value(), reference_cross_entropy(in.a, cast<double>(q)),
                      forward_tolerance<T>);
    const auto soft_got = run<T>(soft, x, q).second;
    const auto soft_want = run<double>(soft, in.a, cast<double>(q)).second;
    test::check_close(soft_got.a, soft_want.a, backward_tolerance<T>);
    test::check_close(soft_got.b, soft_want.b, backward_tolerance<T>);
  }
}

TEST_CASE_TEMPLATE("loss values do not depend on the thread count", T, float, bf16) {
  const Tensor<T> x = randn<T>({4096, 10}, 17), y = randn<T>({4096, 10}, 18);  // several blocks of rows
  const Tensor<std::int64_t> labels = labels_for({4096, 10}, 19);
  auto losses = [&](int threads) {
    test::ThreadCount scope(threads);
    return Pair<T>{mse_loss(constant(x), constant(y)).value(), cross_entropy(constant(x), labels).value()};
  };
  const auto one = losses(1), two = losses(2);
  CHECK(test::bitwise_equal(one.a, two.a));
  CHECK(test::bitwise_equal(one.b, two.b));
}

TEST_CASE("loss errors name the op, the shapes and the bad label") {
  const auto x = constant(randn<double>({2, 3}, 20));
  CHECK_THROWS_WITH_AS(
      mse_loss(x, constant(randn<double>({3, 2}, 21))),
      doctest::Contains("mse_loss: pred has shape [2, 3] but target has shape [3, 2]; they must match exactly"), Error);

  const auto logits = constant(randn<double>({2, 3, 5}, 22));
  CHECK_THROWS_WITH_AS(
      cross_entropy(logits, zeros<std::int64_t>({2})),
      doctest::Contains(
          "cross_entropy: labels have shape [2] but logits of shape [2, 3, 5] need labels of shape [2, 3]"),
      Error);
  Tensor<std::int64_t> labels = zeros<std::int64_t>({2, 3});
  labels(1, 2) = 7;
  CHECK_THROWS_WITH_AS(cross_entropy(logits, labels),
                       doctest::Contains("cross_entropy: label 7 at position [1, 2] is out of range for 5 classes "
                                         "(logits of shape [2, 3, 5])"),
                       Error);
  labels(1, 2) = -1;
  CHECK_THROWS_WITH_AS(cross_entropy(logits, labels),
                       doctest::Contains("cross_entropy: label -1 at position [1, 2] is out of range for 5 classes"),
                       Error);
  CHECK_THROWS_WITH_AS(
      cross_entropy(constant(scalar(1.0)), zeros<std::int64_t>({})),
      doctest::Contains("cross_entropy: logits must have at least one axis (the classes), got shape []"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, constant(zeros<double>({2, 3, 4}))),
                       doctest::Contains("cross_entropy: target_probs has shape [2, 3, 4] "
                                         "but logits have shape [2, 3, 5]; soft targets must match logits exactly"),
                       Error);
}

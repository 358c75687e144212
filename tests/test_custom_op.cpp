#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <tuple>

#include "core_test_helpers.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::check_close;
using test::exact;
using test::map;
using test::zip;

namespace {

// x³, written as a user would with the custom-op API.
Var<double> cube(const Var<double>& x) {
  struct Saved {
    Tensor<double> x;  // d(x³)/dx = 3x² needs x
  };
  return custom_op<Saved>(
      "cube",
      [](Saved& s, const Tensor<double>& in) {
        s.x = in;
        return map(in, [](double v) { return v * v * v; });
      },
      [](const Saved& s, const NeedsGrad&, const Tensor<double>& dy) {
        return zip(s.x, dy, [](double v, double g) { return 3 * v * v * g; });
      },
      x);
}

// x·sin(y): two inputs, each gradient computed only when asked for.
Var<double> x_sin_y(const Var<double>& x, const Var<double>& y) {
  struct Saved {
    Tensor<double> x, y;
  };
  return custom_op<Saved>(
      "x_sin_y",
      [](Saved& s, const Tensor<double>& a, const Tensor<double>& b) {
        s.x = a;
        s.y = b;
        return zip(a, b, [](double u, double v) { return u * std::sin(v); });
      },
      [](const Saved& s, const NeedsGrad& needs, const Tensor<double>& dz) {
        Tensor<double> dx, dy;
        if (needs[0]) dx = zip(s.y, dz, [](double v, double g) { return std::sin(v) * g; });
        if (needs[1]) {
          dy = zip(s.x, s.y, [](double u, double v) { return u * std::cos(v); });
          dy = zip(dy, dz, [](double d, double g) { return d * g; });
        }
        return std::make_tuple(dx, dy);
      },
      x, y);
}

// (sin x, cos x): two outputs from one node.
std::tuple<Var<double>, Var<double>> sin_cos(const Var<double>& x) {
  struct Saved {
    Tensor<double> x;
  };
  return custom_op<Saved>(
      "sin_cos",
      [](Saved& s, const Tensor<double>& in) {
        s.x = in;
        return std::make_tuple(map(in, [](double v) { return std::sin(v); }),
                               map(in, [](double v) { return std::cos(v); }));
      },
      [](const Saved& s, const NeedsGrad&, const Tensor<double>& dsin, const Tensor<double>& dcos) {
        Tensor<double> dx(s.x.shape());
        for (std::int64_t i = 0; i < dx.numel(); ++i) {
          dx.flat(i) = std::cos(s.x.flat(i)) * dsin.flat(i) - std::sin(s.x.flat(i)) * dcos.flat(i);
        }
        return dx;
      },
      x);
}

}  // namespace

TEST_CASE("a one-input custom op records one node and passes gradcheck") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = param(randn<double>({3, 5}, 1));
  Var<double> y = cube(x);
  CHECK(tape.size() == 1);
  CHECK(tape.node(0).name() == "cube");
  CHECK(y.requires_grad());
  CHECK_FALSE(y.is_leaf());
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return cube(in[0]); }, {x.value()}));
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return cube(in[0]); }, {randn<double>({}, 2)}));
}

TEST_CASE("a two-input custom op with saved state records one node and passes gradcheck") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = param(randn<double>({4, 3}, 3)), y = param(randn<double>({4, 3}, 4));
  Var<double> z = x_sin_y(x, y);
  CHECK(tape.size() == 1);
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return x_sin_y(in[0], in[1]); }, {x.value(), y.value()}));
  // Custom ops compose with expressions and with each other.
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return cube(x_sin_y(in[0] * in[1], in[1]) + 1.0); },
                  {x.value(), y.value()}));
}

TEST_CASE("a two-output custom op returns a tuple of Vars from one node") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = param(randn<double>({5}, 5));
  auto [s, c] = sin_cos(x);
  CHECK(tape.size() == 1);
  CHECK(s.value().flat(2) == std::sin(x.value().flat(2)));
  CHECK(c.value().flat(2) == std::cos(x.value().flat(2)));
  CHECK(gradcheck(
      [](const std::vector<Var<double>>& in) {
        auto [a, b] = sin_cos(in[0]);
        return a * 2.0 + b * b;
      },
      {x.value()}));
}

TEST_CASE("an output of a custom op that receives no gradient counts as zero") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> x = param(randn<double>({5}, 6));
  auto [s, c] = sin_cos(x);
  backward(sum(s));  // c takes no part: its gradient arrives as zeros
  check_close(x.grad(), map(x.value(), [](double v) { return std::cos(v); }), exact);
  // Also when the unused output has been dropped altogether.
  x.zero_grad();
  Var<double> only_cos = std::get<1>(sin_cos(x));
  backward(sum(only_cos));
  check_close(x.grad(), map(x.value(), [](double v) { return -std::sin(v); }), exact);
}

TEST_CASE("NeedsGrad says which inputs require grad, and an undefined gradient counts as zero") {
  Tape tape;
  TapeScope scope(tape);
  struct Saved {};
  std::vector<bool> seen;
  auto op = [&](const Var<double>& a, const Var<double>& b) {
    return custom_op<Saved>(
        "probe", [](Saved&, const Tensor<double>& u, const Tensor<double>& v) { return zip(u, v, std::plus<>()); },
        [&seen](const Saved&, const NeedsGrad& needs, const Tensor<double>& dz) {
          seen = {needs[0], needs[1]};
          CHECK(needs.size() == 2);
          // Leave the gradient of an input that needs none undefined, as ops should.
          return std::make_tuple(needs[0] ? dz : Tensor<double>(), needs[1] ? dz : Tensor<double>());
        },
        a, b);
  };
  Var<double> p = param(randn<double>({3}, 7)), k = constant(randn<double>({3}, 8));
  backward(sum(op(p, k)));
  CHECK(seen == std::vector<bool>{true, false});
  check_close(p.grad(), ones<double>({3}), exact);
  CHECK_FALSE(k.grad().defined());
  backward(sum(op(k, p)));
  CHECK(seen == std::vector<bool>{false, true});
  check_close(p.grad(), full<double>({3}, 2.0), exact);

  // An undefined gradient for an input that does require grad is a zero gradient: nothing is added.
  Var<double> q = param(randn<double>({3}, 9));
  Var<double> y = custom_op<Saved>(
      "no_grad_for_first",
      [](Saved&, const Tensor<double>& u, const Tensor<double>& v) { return zip(u, v, std::plus<>()); },
      [](const Saved&, const NeedsGrad&, const Tensor<double>& dz) { return std::make_tuple(Tensor<double>(), dz); },
      q, p);
  p.zero_grad();
  backward(sum(y));
  CHECK_FALSE(q.grad().defined());
  check_close(p.grad(), ones<double>({3}), exact);
}

TEST_CASE("a custom op records nothing when no input requires grad or under NoGradGuard") {
  Tape tape;
  TapeScope scope(tape);
  Var<double> y = cube(constant(randn<double>({2}, 10)));
  CHECK(tape.size() == 0);
  CHECK_FALSE(y.requires_grad());
  NoGradGuard no_grad;
  Var<double> z = cube(param(randn<double>({2}, 10)));
  CHECK(tape.size() == 0);
  CHECK_FALSE(z.requires_grad());
}

TEST_CASE("a backward returning a gradient of the wrong shape throws naming the op and both shapes") {
  Tape tape;
  TapeScope scope(tape);
  struct Saved {};
  Var<double> x = param(randn<double>({2, 3}, 11));
  Var<double> y = custom_op<Saved>(
      "bad_shape", [](Saved&, const Tensor<double>& in) { return in.clone(); },
      [](const Saved&, const NeedsGrad&, const Tensor<double>&) { return ones<double>({3}); }, x);
  CHECK_THROWS_WITH_AS(backward(y, ones<double>({2, 3})),
                       "bad_shape (input 0): backward returned a gradient of shape [3] for a f64 input of shape [2, 3]",
                       AutodiffError);
  CHECK_FALSE(x.grad().defined());
}

namespace {
// Counts live copies of itself, to observe when a node frees what its forward saved.
struct Tracked {
  static inline int alive = 0;
  Tracked() { ++alive; }
  Tracked(const Tracked&) { ++alive; }
  Tracked(Tracked&&) noexcept { ++alive; }
  Tracked& operator=(const Tracked&) = default;
  Tracked& operator=(Tracked&&) = default;
  ~Tracked() { --alive; }
};

Var<double> tracked_identity(const Var<double>& x, std::shared_ptr<int> token) {
  struct Saved {
    Tracked tracked;
    std::shared_ptr<int> token;
  };
  return custom_op<Saved>(
      "tracked",
      [&token](Saved& s, const Tensor<double>& in) {
        s.token = token;
        return in.clone();
      },
      [](const Saved&, const NeedsGrad&, const Tensor<double>& dy) { return dy; }, x);
}
}  // namespace

TEST_CASE("saved state is released after backward without retain_graph") {
  Tape tape;
  TapeScope scope(tape);
  auto token = std::make_shared<int>(0);
  const int before = Tracked::alive;
  Var<double> x = param(randn<double>({3}, 12));
  Var<double> y = tracked_identity(x, token);
  CHECK(token.use_count() == 2);
  CHECK(Tracked::alive == before + 1);
  backward(y, ones<double>({3}));
  CHECK(token.use_count() == 1);
  CHECK(Tracked::alive == before);
}

TEST_CASE("saved state stays with retain_graph until the tape is cleared") {
  Tape tape;
  TapeScope scope(tape);
  auto token = std::make_shared<int>(0);
  Var<double> x = param(randn<double>({3}, 13));
  Var<double> y = tracked_identity(x, token);
  backward(y, ones<double>({3}), {.retain_graph = true});
  CHECK(token.use_count() == 2);
  backward(y, ones<double>({3}), {.retain_graph = true});
  CHECK(token.use_count() == 2);
  check_close(x.grad(), full<double>({3}, 2.0), exact);
  tape.clear();
  CHECK(token.use_count() == 1);
}

TEST_CASE("mixed-dtype inputs get gradients in their own dtypes") {
  Tape tape;
  TapeScope scope(tape);
  struct Saved {
    Tensor<float> a;
    Tensor<bf16> b;
  };
  Var<float> a = param(randn<float>({4}, 14));
  Var<bf16> b = param(randn<bf16>({4}, 15));
  // y = a·b in f32: dy/da = b (f32), dy/db = a (rounded to bf16).
  Var<float> y = custom_op<Saved>(
      "mixed_mul",
      [](Saved& s, const Tensor<float>& u, const Tensor<bf16>& v) {
        s.a = u;
        s.b = v;
        Tensor<float> out(u.shape());
        for (std::int64_t i = 0; i < out.numel(); ++i) out.flat(i) = u.flat(i) * static_cast<float>(v.flat(i));
        return out;
      },
      [](const Saved& s, const NeedsGrad&, const Tensor<float>& dy) {
        Tensor<float> da(s.a.shape());
        Tensor<bf16> db(s.b.shape());
        for (std::int64_t i = 0; i < da.numel(); ++i) {
          da.flat(i) = dy.flat(i) * static_cast<float>(s.b.flat(i));
          db.flat(i) = convert<bf16>(dy.flat(i) * s.a.flat(i));
        }
        return std::make_tuple(da, db);
      },
      a, b);
  CHECK(tape.size() == 1);
  const Tensor<float> dy = randn<float>({4}, 16);
  backward(y, dy);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(a.grad())>, Tensor<float>>);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(b.grad())>, Tensor<bf16>>);
  for (std::int64_t i = 0; i < 4; ++i) {
    CHECK(a.grad().flat(i) == dy.flat(i) * static_cast<float>(b.value().flat(i)));
    CHECK(b.grad().flat(i) == convert<bf16>(dy.flat(i) * a.value().flat(i)));
  }
}

TEST_CASE("a custom op refuses an undefined input and a forward that returns an undefined tensor") {
  struct Saved {};
  const auto identity = [](Saved&, const Tensor<double>& x) { return x; };
  const auto pass_through = [](const Saved&, const NeedsGrad&, const Tensor<double>& dy) { return dy; };
  CHECK_THROWS_WITH_AS(custom_op<Saved>("twice", identity, pass_through, Var<double>()),
                       doctest::Contains("twice: input 0 is undefined (a default-constructed Var"), Error);
  const Var<double> x = param(ones<double>({2}));
  CHECK_THROWS_WITH_AS(custom_op<Saved>("pair", [](Saved&, const Tensor<double>& a, const Tensor<double>&) { return a; },
                                        [](const Saved&, const NeedsGrad&, const Tensor<double>& dy) {
                                          return std::tuple{dy, dy};
                                        },
                                        x, Var<double>()),
                       doctest::Contains("pair: input 1 is undefined"), Error);
  CHECK_THROWS_WITH_AS(custom_op<Saved>("joined", [](Saved&, const std::vector<Tensor<double>>& v) { return v[0]; },
                                        [](const Saved&, const NeedsGrad&, const Tensor<double>& dy) {
                                          return std::vector<Tensor<double>>{dy, dy};
                                        },
                                        std::vector<Var<double>>{x, Var<double>()}),
                       doctest::Contains("joined: input 1 is undefined"), Error);
  CHECK_THROWS_WITH_AS(
      custom_op<Saved>("lost", [](Saved&, const Tensor<double>&) { return Tensor<double>(); }, pass_through, x),
      "lost: output 0 of its forward is undefined (a default-constructed Tensor, with no storage)", Error);
  CHECK(custom_op<Saved>("twice", identity, pass_through, x).value().flat(1) == 1.0);  // a good call still works
}

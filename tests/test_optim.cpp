#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "momentum_precision.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using namespace tapegrad::optim;
using test::Tolerance;

namespace {

// PyTorch's update rules written out in double, one element at a time, on a parameter `p` with gradient `grad`.
struct ReferenceState {
  int t = 0;
  std::vector<double> momentum, m, v;
};
using ReferenceRule = std::function<void(ReferenceState&, std::vector<double>& p, const std::vector<double>& grad)>;

ReferenceRule reference_sgd(SGDOptions o) {
  return [o](ReferenceState& s, std::vector<double>& p, const std::vector<double>& grad) {
    ++s.t;
    s.momentum.resize(p.size());
    for (std::size_t e = 0; e < p.size(); ++e) {
      double d_p = grad[e] + o.weight_decay * p[e];
      if (o.momentum != 0) {
        double& buf = s.momentum[e];
        buf = s.t == 1 ? d_p : o.momentum * buf + (1 - o.dampening) * d_p;
        d_p = o.nesterov ? d_p + o.momentum * buf : buf;
      }
      p[e] -= o.lr * d_p;
    }
  };
}

// Adam (decoupled = false) or AdamW, in the paper's form with bias-corrected moments m̂ and v̂.
template <double D> ReferenceRule reference_adam(AdamHyperparameters<D> o, bool decoupled) {
  return [o, decoupled](ReferenceState& s, std::vector<double>& p, const std::vector<double>& grad) {
    ++s.t;
    s.m.resize(p.size());
    s.v.resize(p.size());
    for (std::size_t e = 0; e < p.size(); ++e) {
      double g = grad[e];
      if (decoupled) {
        p[e] -= o.lr * o.weight_decay * p[e];
      } else {
        g += o.weight_decay * p[e];
      }
      s.m[e] = o.beta1 * s.m[e] + (1 - o.beta1) * g;
      s.v[e] = o.beta2 * s.v[e] + (1 - o.beta2) * g * g;
      const double m_hat = s.m[e] / (1 - std::pow(o.beta1, s.t)), v_hat = s.v[e] / (1 - std::pow(o.beta2, s.t));
      p[e] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
    }
  };
}

// The optimizer against the double reference, whose parameter is rounded to its dtype after each step as the
// optimizer's is. f64 keeps f64 state: f32 state would miss its tolerance by orders of magnitude. f32: a few f32
// roundings per step. bf16/f16 round as the reference does unless the f32 and the f64 result fall on either side of
// a rounding boundary; from then on the parameters differ by one ulp (2⁻⁷, 2⁻¹⁰ relative), which is one ulp of a
// value of order 1 (atol) for an element that has since moved toward zero.
template <class T> constexpr Tolerance tolerance{};
template <> constexpr Tolerance tolerance<double>{1e-13, 1e-15};
template <> constexpr Tolerance tolerance<float>{1e-5, 1e-7};
template <> constexpr Tolerance tolerance<bf16>{8e-3, 4e-3};
template <> constexpr Tolerance tolerance<f16>{1e-3, 5e-4};

template <class T> std::vector<double> to_doubles(const Tensor<T>& t) {
  std::vector<double> out;
  for (std::int64_t i = 0; i < t.numel(); ++i) out.push_back(convert<double>(t.flat(i)));
  return out;
}

// Runs an optimizer and the reference side by side on the same random gradients.
class SideBySide {
 public:
  SideBySide(Optimizer& optimizer, ReferenceRule rule)
      : optimizer_(optimizer), rule_(std::move(rule)), states_(optimizer.parameters().size()) {
    for (const nn::NamedParameter& p : optimizer.parameters()) {
      want_.push_back(std::visit([](const auto& var) { return to_doubles(var.value()); }, p.var));
    }
  }

  // One step in which parameter i gets a random gradient when receives[i] (every parameter when empty).
  void step(std::uint64_t seed, const std::vector<bool>& receives = {}) {
    optimizer_.zero_grad();
    const nn::ParameterList& params = optimizer_.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!receives.empty() && !receives[i]) continue;
      std::visit(
          [&](const auto& var) {
            using T = typename std::remove_cvref_t<decltype(var.value())>::value_type;
            const Tensor<T> grad = randn<T>(var.shape(), seed + i);
            backward(var, grad);
            rule_(states_[i], want_[i], to_doubles(grad));
            for (double& w : want_[i]) w = convert<double>(convert<T>(w));
          },
          params[i].var);
    }
    optimizer_.step();
  }

  void check() const {
    const nn::ParameterList& params = optimizer_.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      CAPTURE(params[i].path);
      std::visit(
          [&](const auto& var) {
            using T = typename std::remove_cvref_t<decltype(var.value())>::value_type;
            test::check_close(var.value(), from_vector(want_[i], var.shape()), tolerance<T>);
          },
          params[i].var);
    }
  }

 private:
  Optimizer& optimizer_;
  ReferenceRule rule_;
  std::vector<ReferenceState> states_;
  std::vector<std::vector<double>> want_;
};

// One parameter of each dtype, with odd shapes, in one list.
nn::ParameterList mixed_parameters() {
  return {{"f32", param(randn<float>({3, 5}, 1))},
          {"f64", param(randn<double>({7}, 2))},
          {"bf16", param(randn<bf16>({2, 3, 5}, 3))},
          {"f16", param(randn<f16>({11}, 4))}};
}

void check_against_reference(Optimizer& optimizer, const ReferenceRule& rule) {
  SideBySide run(optimizer, rule);
  for (std::uint64_t step = 1; step <= 6; ++step) run.step(100 * step);
  run.check();
}

}  // namespace

TEST_CASE("SGD follows PyTorch's formulas for parameters of every dtype in one list") {
  const SGDOptions cases[] = {
      {.lr = 0.1},
      {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01},
      {.lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.1},
      {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true},
  };
  for (const SGDOptions& o : cases) {
    CAPTURE(o.momentum);
    CAPTURE(o.dampening);
    CAPTURE(o.nesterov);
    SGD sgd(mixed_parameters(), o);
    check_against_reference(sgd, reference_sgd(o));
  }
}

TEST_CASE("Adam and AdamW follow PyTorch's formulas for parameters of every dtype in one list") {
  for (const AdamOptions& o : {AdamOptions{.lr = 0.01}, AdamOptions{.lr = 0.02, .beta1 = 0.8, .beta2 = 0.99,
                                                                     .eps = 1e-6, .weight_decay = 0.1}}) {
    Adam adam(mixed_parameters(), o);
    check_against_reference(adam, reference_adam(o, false));
  }
  for (const AdamWOptions& o : {AdamWOptions{.lr = 0.01}, AdamWOptions{.lr = 0.02, .beta1 = 0.8, .beta2 = 0.99,
                                                                        .eps = 1e-6, .weight_decay = 0.15}}) {
    AdamW adamw(mixed_parameters(), o);
    check_against_reference(adamw, reference_adam(o, true));
  }
}

TEST_CASE("a parameter without a gradient is skipped: its value and its state stay as they are") {
  // b gets no gradient at step 2: its momentum must not decay, and Adam's bias correction must count its own
  // updates (its step 3 is its second).
  const SGDOptions sgd_options{.lr = 0.1, .momentum = 0.9};
  const AdamOptions adam_options{.lr = 0.05};
  std::vector<std::pair<std::unique_ptr<Optimizer>, ReferenceRule>> cases;
  const auto params = [] {
    return nn::ParameterList{{"a", param(randn<double>({4}, 1))}, {"b", param(randn<double>({4}, 2))}};
  };
  cases.emplace_back(std::make_unique<SGD>(params(), sgd_options), reference_sgd(sgd_options));
  cases.emplace_back(std::make_unique<Adam>(params(), adam_options), reference_adam(adam_options, false));
  for (auto& [optimizer, rule] : cases) {
    SideBySide run(*optimizer, rule);
    run.step(10);
    const Var<double> b = std::get<Var<double>>(optimizer->parameters()[1].var);
    const Tensor<double> b_after_first = b.value().clone();
    run.step(20, {true, false});
    CHECK_FALSE(b.grad().defined());
    CHECK(test::bitwise_equal(b.value(), b_after_first));
    run.step(30);
    run.check();
  }
}

TEST_CASE("a bf16 parameter's momentum is kept in f32, so gradients too small for bf16 still add up") {
  test::check_bf16_momentum_kept_in_f32(Device::cpu());
}

TEST_CASE("AdamW decays weights directly, Adam through the gradient") {
  // With a zero gradient, AdamW only scales p by 1 - lr·wd (its moments stay 0); Adam's gradient becomes wd·p,
  // and its first step moves each element by lr against its sign (m̂/√v̂ = ±1, up to eps/|wd·p|).
  const Tensor<double> start = randn<double>({6}, 5);
  Var<double> a = param(start.clone()), w = param(start.clone());
  Adam adam({a}, {.lr = 0.01, .weight_decay = 0.1});
  AdamW adamw({w}, {.lr = 0.01, .weight_decay = 0.1});
  backward(a, zeros<double>({6}));
  backward(w, zeros<double>({6}));
  adam.step();
  adamw.step();
  for (std::int64_t i = 0; i < 6; ++i) {
    CHECK(w.value().flat(i) == doctest::Approx(start.flat(i) * (1 - 0.01 * 0.1)).epsilon(1e-15));
    CHECK(std::abs(a.value().flat(i) - (start.flat(i) - 0.01 * std::copysign(1.0, start.flat(i)))) < 1e-6);
  }
  CHECK(Adam({a}).options().weight_decay == 0);
  CHECK(AdamW({w}).options().weight_decay == 0.01);
}

TEST_CASE("bad hyperparameters and parameter lists throw errors naming the optimizer and the value") {
  const Var<float> w = param(randn<float>({2}, 1));
  CHECK_THROWS_WITH_AS(SGD({w}, {.lr = -0.1}), "SGD: lr must be >= 0, got -0.1", Error);
  CHECK_THROWS_WITH_AS(SGD({w}, {.momentum = -1}), "SGD: momentum must be >= 0, got -1", Error);
  CHECK_THROWS_WITH_AS(SGD({w}, {.dampening = 1.5}), "SGD: dampening must be in [0, 1], got 1.5", Error);
  CHECK_THROWS_WITH_AS(SGD({w}, {.weight_decay = -0.01}), "SGD: weight_decay must be >= 0, got -0.01", Error);
  CHECK_THROWS_WITH_AS(SGD({w}, {.nesterov = true}), "SGD: momentum must be > 0 with nesterov, got 0", Error);
  CHECK_THROWS_WITH_AS(SGD({w}, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                       "SGD: dampening must be 0 with nesterov, got 0.1", Error);
  CHECK_THROWS_WITH_AS(Adam({w}, {.lr = -1}), "Adam: lr must be >= 0, got -1", Error);
  CHECK_THROWS_WITH_AS(Adam({w}, {.beta1 = 1}), "Adam: beta1 must be in [0, 1), got 1", Error);
  CHECK_THROWS_WITH_AS(Adam({w}, {.beta2 = -0.5}), "Adam: beta2 must be in [0, 1), got -0.5", Error);
  CHECK_THROWS_WITH_AS(Adam({w}, {.eps = 0}), "Adam: eps must be > 0, got 0", Error);
  CHECK_THROWS_WITH_AS(AdamW({w}, {.weight_decay = -1}), "AdamW: weight_decay must be >= 0, got -1", Error);
  CHECK_THROWS_WITH_AS(AdamW({w}, {.lr = NAN}), "AdamW: lr must be >= 0, got nan", Error);

  CHECK_THROWS_WITH_AS(SGD({w, w}), "SGD: parameter '1' is the same variable as parameter '0': each parameter may "
                                    "appear only once", Error);
  CHECK_THROWS_WITH_AS(Adam(nn::ParameterList{{"enc.w", w}, {"dec.w", w}}),
                       "Adam: parameter 'dec.w' is the same variable as parameter 'enc.w': each parameter may "
                       "appear only once", Error);
  CHECK_THROWS_WITH_AS(SGD({Var<bf16>{}}), "SGD: parameter '0' is an undefined Var", Error);

  // A gradient of the wrong shape (backward checks shapes itself, so it is set directly) is found before any
  // parameter changes.
  const Var<float> v = param(randn<float>({4}, 2));
  const Tensor<float> v_before = v.value().clone();
  SGD sgd(nn::ParameterList{{"layer.v", v}, {"layer.w", w}});
  backward(v, ones<float>({4}));
  w.slot()->grad = zeros<float>({3});
  CHECK_THROWS_WITH_AS(sgd.step(), "SGD: parameter 'layer.w' has a gradient of shape [3] but its value has shape [2]",
                       Error);
  CHECK(test::bitwise_equal(v.value(), v_before));
}

TEST_CASE("a large parameter's update does not depend on the thread count") {
  // Large enough for the pool to split it; Adam's update is elementwise, so any split gives the same bits.
  std::vector<Tensor<bf16>> results;
  for (int threads : {1, 2}) {
    test::ThreadCount count(threads);
    Var<bf16> w = param(randn<bf16>({300, 301}, 1));
    Adam adam({w}, {.lr = 0.01, .weight_decay = 0.1});
    for (std::uint64_t step = 0; step < 3; ++step) {
      adam.zero_grad();
      backward(w, randn<bf16>(w.shape(), 10 + step));
      adam.step();
    }
    results.push_back(w.value());
  }
  CHECK(test::bitwise_equal(results[0], results[1]));
}

TEST_CASE("each optimizer fits a small linear regression from the tape's gradients") {
  const Var<float> x = constant(randn<float>({64, 8}, 1));
  const Var<float> y = [&] {
    NoGradGuard no_grad;
    const Var<float> targets = matmul(x, constant(randn<float>({8, 1}, 2))) + 0.5;
    return constant(targets.value());
  }();
  const std::vector<std::pair<std::string, std::function<std::unique_ptr<Optimizer>(nn::ParameterList)>>> makers{
      {"SGD", [](nn::ParameterList p) { return std::make_unique<SGD>(std::move(p), SGDOptions{.lr = 0.1}); }},
      {"SGD with Nesterov momentum",
       [](nn::ParameterList p) {
         return std::make_unique<SGD>(std::move(p), SGDOptions{.lr = 0.02, .momentum = 0.9, .nesterov = true});
       }},
      {"Adam", [](nn::ParameterList p) { return std::make_unique<Adam>(std::move(p), AdamOptions{.lr = 0.05}); }},
      {"AdamW", [](nn::ParameterList p) { return std::make_unique<AdamW>(std::move(p), AdamWOptions{.lr = 0.05}); }},
  };
  for (const auto& [name, make] : makers) {
    CAPTURE(name);
    Var<float> w = param(zeros<float>({8, 1})), b = param(zeros<float>({1}));
    const std::unique_ptr<Optimizer> optimizer = make({{"w", w}, {"b", b}});
    float first = 0, last = 0;
    for (int step = 0; step < 200; ++step) {
      optimizer->zero_grad();
      const Var<float> loss = mse_loss(matmul(x, w) + b, y);
      backward(loss);
      optimizer->step();
      (step == 0 ? first : last) = loss.value().item();
      Tape::active().clear();
    }
    CHECK(first > 1);
    CHECK(last < 1e-3 * first);
  }
}

TEST_CASE("the README's optimizer example trains") {
  const Var<float> x = constant(randn<float>({64, 8}, 1)), y = constant(randn<float>({64, 1}, 2));
  Var<float> w = param(zeros<float>({8, 1})), b = param(zeros<float>({1}));

  optim::AdamW optimizer({{"w", w}, {"b", b}}, {.lr = 1e-2});  // or plain Vars: optimizer({w, b}, ...)
  float first = 0, last = 0;
  for (int step = 0; step < 100; ++step) {
    optimizer.zero_grad();
    Var<float> loss = mse_loss(matmul(x, w) + b, y);
    backward(loss);
    optimizer.step();  // updates w and b in place
    Tape::active().clear();
    (step == 0 ? first : last) = loss.value().item();
  }
  CHECK(last < 0.9 * first);
}

TEST_CASE("non-finite hyperparameters throw naming the optimizer and the value") {
  const Var<float> w = param(randn<float>({2}, 1));
  CHECK_THROWS_WITH_AS(AdamW({w}, {.lr = INFINITY}), "AdamW: lr must be finite, got inf", Error);
  CHECK_THROWS_WITH_AS(Adam({w}, {.eps = INFINITY}), "Adam: eps must be finite, got inf", Error);
  CHECK_THROWS_WITH_AS(AdamW({w}, {.weight_decay = NAN}), "AdamW: weight_decay must be >= 0, got nan", Error);
  CHECK_THROWS_WITH_AS(SGD({w}, {.momentum = INFINITY}), "SGD: momentum must be finite, got inf", Error);
  CHECK(SGD({w}, {.lr = 0.1}).options().lr == 0.1);
}

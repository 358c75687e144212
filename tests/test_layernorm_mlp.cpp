// layernorm_mlp: the one-node block against the composite of primitive ops, gradchecks over every option,
// recompute policies, mixed precision, low precision against a double reference, and errors.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "mlp_cases.hpp"
#include "support.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/check.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using namespace tapegrad::mlp_test;
using test::Tolerance;

TEST_CASE("layernorm_mlp equals the composite of primitive ops in double, output and every gradient") {
  const Tolerance double_rounding{1e-12, 1e-12};
  for (bool return_h : {false, true}) {
    for_each_case([&](Case c) {
      if (c.options.recompute != Recompute::save_all) return;  // policies are compared bitwise below
      c.options.return_layernorm_output = return_h;
      const Tensor<double> xv = randn<double>({2, 3, 8}, 11, 0.3, 1.5);
      const Params<double> p = make_params<double>(c, 8, 6, 20);
      const Var<double> x1 = param(xv), x2 = param(xv);
      const auto got = node(x1, p, c.options);
      backward(weighted_loss(got, 30));
      std::vector<Tensor<double>> node_grads;
      for (const auto& v : defined_params(p)) node_grads.push_back(v.grad());
      for (auto v : defined_params(p)) v.zero_grad();

      const auto want = composite(x2, p, c.options);
      backward(weighted_loss(want, 30));
      test::check_close(got.y.value(), want.y.value(), double_rounding);
      if (return_h) test::check_close(got.layernorm_output.value(), want.layernorm_output.value(), double_rounding);
      test::check_close(x1.grad(), x2.grad(), double_rounding);
      const auto params = defined_params(p);
      for (std::size_t i = 0; i < params.size(); ++i) test::check_close(node_grads[i], params[i].grad(), double_rounding);
      Tape::active().clear();
    });
  }
}

TEST_CASE("layernorm_mlp passes gradcheck for every activation, norm, gamma form, bias setting and policy") {
  for_each_case([](const Case& c) {
    const Params<double> p0 = make_params<double>(c, 4, 3, 40);
    auto f = [&](const std::vector<Var<double>>& in) { return node(in[0], params_from(c, in), c.options).y; };
    CHECK(gradcheck(f, values_of(randn<double>({2, 2, 4}, 41, 0.2, 1.2), p0)));
  });
}

TEST_CASE("the returned norm output is differentiable: gradcheck through both results") {
  for (Activation act : all_activations) {
    for (Recompute policy : all_policies) {
      const Case c{.options = {.activation = act, .return_layernorm_output = true, .recompute = policy}};
      const std::string what = describe(c);
      CAPTURE(what);
      const Params<double> p0 = make_params<double>(c, 5, 4, 50);
      std::vector<Tensor<double>> inputs{randn<double>({3, 5}, 51)};
      for (const auto& v : defined_params(p0)) inputs.push_back(v.value());
      CHECK(gradcheck(
          [&](const std::vector<Var<double>>& in) {
            const Params<double> p{in[1], in[2], in[3], in[4], in[5], in[6]};
            const auto out = node(in[0], p, c.options);
            return Var<double>(out.y * 2.0 + out.layernorm_output * out.layernorm_output);
          },
          inputs));
    }
  }
}

TEST_CASE("clamped_swiglu clamps: its limits bite, and it still matches the composite and gradcheck") {
  for (const ClampedSwigluParams params : {ClampedSwigluParams{0.3, 1.702}, ClampedSwigluParams{0.5, 1.0}}) {
    CAPTURE(params.limit);
    const Case c{.options = {.activation = Activation::clamped_swiglu, .clamped_swiglu = params}};
    const Params<double> p = make_params<double>(c, 6, 5, 60);
    const Var<double> x = param(randn<double>({4, 6}, 61, 0.0, 2.0));
    const auto got = node(x, p, c.options), want = composite(x, p, c.options);
    test::check_close(got.y.value(), want.y.value(), {1e-12, 1e-12});
    // With limit 0.3 and z ~ N(0, 1), both clamps act on many elements: an unclamped swiglu differs.
    Case unclamped = c;
    unclamped.options.clamped_swiglu.limit = 1e6;
    const Tensor<double> loose = node(x, p, unclamped.options).y.value();
    double difference = 0.0;
    for (std::int64_t i = 0; i < loose.numel(); ++i) difference += std::abs(loose.flat(i) - got.y.value().flat(i));
    CHECK(difference > 0.1);

    std::vector<Tensor<double>> inputs{x.value()};
    for (const auto& v : defined_params(p)) inputs.push_back(v.value());
    CHECK(gradcheck(
        [&](const std::vector<Var<double>>& in) {
          return node(in[0], Params<double>{in[1], in[2], in[3], in[4], in[5], in[6]}, c.options).y;
        },
        inputs));
  }
}

TEST_CASE("layernorm_mlp records one tape entry however many ops it does") {
  for (bool return_h : {false, true}) {
    const Case c{.options = {.activation = Activation::swiglu, .return_layernorm_output = return_h}};
    const Params<float> p = make_params<float>(c, 16, 32, 70);
    const Var<float> x = param(randn<float>({4, 16}, 71));
    Tape::active().clear();
    const auto out = node(x, p, c.options);
    CHECK(Tape::active().size() == 1);
    CHECK(out.layernorm_output.defined() == return_h);
    backward(weighted_loss(out, 72));
    CHECK(x.grad().defined());
    Tape::active().clear();
  }
}

TEST_CASE_TEMPLATE("every recompute policy gives bitwise identical gradients, for any thread count", T, float, double,
                   bf16) {
  for (Activation act : all_activations) {
    CAPTURE(activation_name(act));
    const Case base{.options = {.activation = act}};
    const Params<T> p = make_params<T>(base, 24, 40, 80);
    const Tensor<T> xv = randn<T>({3, 5, 24}, 81);
    auto grads_of = [&](Recompute policy, int threads) {
      test::ThreadCount scope(threads);
      Case c = base;
      c.options.recompute = policy;
      const Var<T> x = param(xv);
      for (auto v : defined_params(p)) v.zero_grad();
      backward(weighted_loss(node(x, p, c.options), 82));
      std::vector<Tensor<T>> grads{x.grad()};
      for (const auto& v : defined_params(p)) grads.push_back(v.grad());
      return grads;
    };
    const auto reference = grads_of(Recompute::save_all, 2);
    for (Recompute policy : all_policies) {
      for (int threads : {1, 2}) {
        CAPTURE(recompute_name(policy));
        CAPTURE(threads);
        const auto grads = grads_of(policy, threads);
        for (std::size_t i = 0; i < grads.size(); ++i) CHECK(test::bitwise_equal(grads[i], reference[i]));
      }
    }
  }
}

namespace {

template <class P> Params<double> params_to_double(const Params<P>& p) {
  auto to_double = [](const Var<P>& v) { return v.defined() ? param(cast<double>(v.value())) : Var<double>(); };
  return {to_double(p.gamma), to_double(p.beta), to_double(p.w1), to_double(p.b1), to_double(p.w2), to_double(p.b2)};
}

// Compares the node in T with parameters in P against the double composite on the same (rounded) values: the
// output element by element, each gradient by its relative error (‖got - want‖₂ / ‖want‖₂): where z is within
// rounding of a kink (relu's 0), the low-precision z may sit on the other side, and that element's derivative
// jumps; the norm weighs such rare flips by their share of the whole.
template <class T, class P> void check_against_double(const Case& c, Tolerance output_tol, double grad_tol) {
  const Params<P> p = make_params<P>(c, 32, 48, 90);
  const Var<T> x = param(randn<T>({4, 6, 32}, 91, 0.5, 2.0));
  const auto got = node(x, p, c.options);
  backward(weighted_loss(got, 92));

  // The reference sees exactly the values the node computes with: W1, W2 and the biases rounded to T.
  Params<double> ref = params_to_double(p);
  for (Var<double>* v : {&ref.w1, &ref.b1, &ref.w2, &ref.b2}) {
    if (v->defined()) *v = param(cast<double>(cast<T>(cast<P>(v->value()))));
  }
  const Var<double> xd = param(cast<double>(x.value()));
  const auto want = composite(xd, ref, c.options);
  backward(weighted_loss(want, 92));
  test::check_close(got.y.value(), want.y.value(), output_tol);
  CHECK(test::relative_error(x.grad(), xd.grad()) <= grad_tol);
  const auto node_params = defined_params(p);
  const auto ref_params = defined_params(ref);
  for (std::size_t i = 0; i < node_params.size(); ++i) {
    CAPTURE(i);
    CHECK(test::relative_error(node_params[i].grad(), ref_params[i].grad()) <= grad_tol);
  }
}

}  // namespace

// Tolerances (measured worst of all activations and both norms in brackets): f32 rounds each stage's output once
// (~6e-8) and sums 32-48 terms: output 1e-5, gradients 2e-6 relative [4.4e-7]. bf16 (8 bits) and f16 (11 bits)
// round every stage's output (h, z, a, y; da, dz, dh), and the errors pass through the products and the
// activation's slope: bf16 output 4e-2, gradients 2e-2 [5.9e-3]; f16 output 6e-3, gradients 3e-3 [8.4e-4], but
// 2e-2 for relu [1.4e-2]: a z within f16 rounding of 0 lands on the other side of the kink, and that row's
// derivative jumps by the whole slope.
TEST_CASE_TEMPLATE("low-precision layernorm_mlp matches the double composite, forward and backward", T, float, bf16,
                   f16) {
  const bool is_f32 = std::is_same_v<T, float>, is_bf16 = std::is_same_v<T, bf16>;
  const Tolerance output_tol = is_f32 ? Tolerance{1e-5, 1e-5} : is_bf16 ? Tolerance{4e-2, 4e-2} : Tolerance{6e-3, 6e-3};
  for (Activation act : all_activations) {
    const double grad_tol = is_f32 ? 2e-6 : is_bf16 ? 2e-2 : act == Activation::relu ? 2e-2 : 3e-3;
    for (NormType norm : {NormType::layernorm, NormType::rmsnorm}) {
      const Case c{.options = {.norm = norm, .activation = act}};
      const std::string what = describe(c);
      CAPTURE(what);
      check_against_double<T, T>(c, output_tol, grad_tol);
    }
  }
}

TEST_CASE("mixed precision: f32 parameters with bf16 compute give f32 gradients that keep f32 precision") {
  for (Activation act : {Activation::gelu, Activation::swiglu}) {
    const Case c{.options = {.activation = act}};
    CAPTURE(activation_name(act));
    // The tolerances of the lower of the two precisions (above); bf16 gradients of f32 compute are rounded once.
    check_against_double<bf16, float>(c, {4e-2, 4e-2}, 2e-2);
    check_against_double<float, bf16>(c, {1e-5, 1e-5}, 4e-3);
    check_against_double<f16, double>(c, {6e-3, 6e-3}, 3e-3);

    // The weight gradients are rounded once from f32 sums, not from bf16 ones: most are not bf16 values.
    const Params<float> p = make_params<float>(c, 32, 48, 95);
    const Var<bf16> x = param(randn<bf16>({8, 32}, 96));
    const auto out = node(x, p, c.options);
    CHECK(out.y.dtype() == DType::bf16);
    backward(weighted_loss(out, 97));
    const Tensor<float>& dw1 = p.w1.grad();
    std::int64_t not_bf16 = 0;
    for (std::int64_t i = 0; i < dw1.numel(); ++i) not_bf16 += float(bf16(dw1.flat(i))) != dw1.flat(i);
    CHECK(not_bf16 > dw1.numel() / 2);
  }
}

TEST_CASE("layernorm_mlp computes only the gradients asked for") {
  const Case c{.options = {.activation = Activation::geglu}};
  const Params<double> p = make_params<double>(c, 6, 4, 100);
  const Var<double> x = constant(randn<double>({3, 6}, 101));
  backward(weighted_loss(node(x, p, c.options), 102));
  CHECK_FALSE(x.grad().defined());
  for (const auto& v : defined_params(p)) CHECK(v.grad().defined());

  const Params<double> frozen = params_to_double(p);
  std::vector<Var<double>> constants;
  for (const auto& v : defined_params(frozen)) constants.push_back(v.detach());
  const Params<double> q{constants[0], constants[1], constants[2], constants[3], constants[4], constants[5]};
  const Var<double> x2 = param(x.value());
  const auto out = node(x2, q, c.options);
  backward(weighted_loss(out, 102));
  CHECK(x2.grad().defined());
  for (const auto& v : defined_params(q)) CHECK_FALSE(v.grad().defined());
}

TEST_CASE("layernorm_mlp takes any leading dims, a single row, and no rows") {
  const Case c{.options = {.activation = Activation::silu}};
  const Params<double> p = make_params<double>(c, 5, 7, 110);
  for (const Shape& shape : {Shape{5}, Shape{1, 5}, Shape{2, 1, 3, 5}}) {
    CAPTURE(shape);
    const Var<double> x = param(randn<double>(shape, 111));
    const auto got = node(x, p, c.options), want = composite(x, p, c.options);
    CHECK(got.y.shape() == shape);
    test::check_close(got.y.value(), want.y.value(), {1e-12, 1e-12});
  }
  const Var<double> empty = param(Tensor<double>(Shape{0, 5}));
  for (auto v : defined_params(p)) v.zero_grad();
  const auto out = node(empty, p, c.options);
  CHECK(out.y.shape() == Shape{0, 5});
  backward(out.y, Tensor<double>(Shape{0, 5}));
  CHECK(empty.grad().shape() == Shape{0, 5});
  CHECK(test::bitwise_equal(p.w1.grad(), zeros<double>(p.w1.shape())));
  CHECK(test::bitwise_equal(p.b2.grad(), zeros<double>(p.b2.shape())));
}

TEST_CASE("activation names round-trip and gated activations need two halves") {
  for (Activation act : all_activations) CHECK(activation_from_name(activation_name(act)) == act);
  CHECK(is_gated(Activation::swiglu));
  CHECK_FALSE(is_gated(Activation::gelu));
  CHECK(activation_width(Activation::clamped_swiglu) == 2);
  CHECK_THROWS_WITH_AS(activation_from_name("swish"),
                       doctest::Contains("unknown activation 'swish'; expected one of relu, gelu"), Error);
}

TEST_CASE("layernorm_mlp errors name the op and both shapes") {
  const Case gated{.options = {.activation = Activation::swiglu}};
  const Params<float> p = make_params<float>(gated, 256, 512, 120);
  const Var<float> x = param(randn<float>({4, 256}, 121));
  auto with = [&](auto edit) {
    Params<float> q = p;
    LayerNormMLPOptions o = gated.options;
    edit(q, o);
    return [=] { node(x, q, o); };
  };
  const Var<float> w1_wrong = param(randn<float>({128, 2, 512}, 1));
  CHECK_THROWS_WITH_AS(node(param(randn<float>({4, 128}, 1)), p, gated.options),
                       doctest::Contains("layernorm_mlp: gamma has shape [256] but x has shape [4, 128]"), Error);
  CHECK_THROWS_WITH_AS(
      with([&](Params<float>& q, LayerNormMLPOptions&) { q.w1 = w1_wrong; })(),
      doctest::Contains("w1 has shape [128, 2, 512] but x has hidden size 256 and activation swiglu needs [256, 2, F]"),
      Error);
  CHECK_THROWS_WITH_AS(with([](Params<float>&, LayerNormMLPOptions& o) { o.activation = Activation::gelu; })(),
                       doctest::Contains("activation gelu needs [256, 1, F]"), Error);
  CHECK_THROWS_WITH_AS(with([](Params<float>& q, LayerNormMLPOptions&) { q.w2 = param(zeros<float>({256, 512})); })(),
                       doctest::Contains("w2 has shape [256, 512] but w1 has shape [256, 2, 512]"), Error);
  CHECK_THROWS_WITH_AS(with([](Params<float>& q, LayerNormMLPOptions&) { q.b1 = param(zeros<float>({512})); })(),
                       doctest::Contains("b1 has shape [512] but w1 has shape [256, 2, 512]; expected [2, 512]"),
                       Error);
  CHECK_THROWS_WITH_AS(with([](Params<float>& q, LayerNormMLPOptions&) { q.b2 = param(zeros<float>({512})); })(),
                       doctest::Contains("b2 has shape [512] but x has shape [4, 256]; expected [256]"), Error);
  CHECK_THROWS_WITH_AS(with([](Params<float>&, LayerNormMLPOptions& o) { o.norm = NormType::rmsnorm; })(),
                       doctest::Contains("rmsnorm has no beta, but one of shape [256] was given"), Error);
  CHECK_THROWS_WITH_AS(with([](Params<float>&, LayerNormMLPOptions& o) { o.epsilon = 0; })(),
                       doctest::Contains("epsilon must be positive"), Error);
  CHECK_THROWS_WITH_AS(with([](Params<float>&, LayerNormMLPOptions& o) {
                         o.activation = Activation::clamped_swiglu;
                         o.clamped_swiglu.limit = -1;
                       })(),
                       doctest::Contains("clamped_swiglu needs a positive limit"), Error);
  CHECK_THROWS_WITH_AS(with([](Params<float>& q, LayerNormMLPOptions&) { q.w2 = Var<float>(); })(),
                       doctest::Contains("x, gamma, w1 and w2 must be defined"), Error);
}

TEST_CASE("layernorm_mlp and its composite refuse the same arguments with the same message") {
  const Case plain{.options = {.activation = Activation::gelu}};
  const Params<float> p = make_params<float>(plain, 8, 16, 130);
  const Var<float> x = param(randn<float>({3, 8}, 131));
  struct Bad {
    std::string problem;  // what the message says after the op's name
    std::function<void(Params<float>&, LayerNormMLPOptions&)> edit;
  };
  // The options and kernels of a gated block.
  const auto clamped_swiglu = [](Params<float>& q, LayerNormMLPOptions o) {
    o.activation = Activation::clamped_swiglu;
    q.w1 = param(zeros<float>({8, 2, 16}));
    q.b1 = param(zeros<float>({2, 16}));
    return o;
  };
  const std::vector<Bad> cases{
      {"recompute 7 is not a Recompute policy", [](auto&, auto& o) { o.recompute = Recompute(7); }},
      {"norm 5 is not a NormType (layernorm or rmsnorm)", [](auto&, auto& o) { o.norm = NormType(5); }},
      {"unknown activation 42", [](auto&, auto& o) { o.activation = Activation(42); }},
      {"epsilon must be finite, got inf", [](auto&, auto& o) { o.epsilon = INFINITY; }},
      {"epsilon must be positive, got nan", [](auto&, auto& o) { o.epsilon = NAN; }},
      {"clamped_swiglu needs a finite alpha, got nan",
       [&](auto& q, auto& o) { o = clamped_swiglu(q, o); o.clamped_swiglu.alpha = NAN; }},
      {"clamped_swiglu needs a positive limit, got -1",
       [&](auto& q, auto& o) { o = clamped_swiglu(q, o); o.clamped_swiglu.limit = -1; }},
      {"clamped_swiglu needs a finite limit, got inf",
       [&](auto& q, auto& o) { o = clamped_swiglu(q, o); o.clamped_swiglu.limit = INFINITY; }},
      {"w1 has shape [8, 2, 16] but x has hidden size 8 and activation gelu needs [8, 1, F]",
       [](auto& q, auto&) { q.w1 = param(zeros<float>({8, 2, 16})); }},
      {"rmsnorm has no beta, but one of shape [8] was given", [](auto&, auto& o) { o.norm = NormType::rmsnorm; }},
      {"b1 has shape [16] but w1 has shape [8, 1, 16]; expected [1, 16]",
       [](auto& q, auto&) { q.b1 = param(zeros<float>({16})); }},
      {"b2 has shape [1] but x has shape [3, 8]; expected [8]", [](auto& q, auto&) { q.b2 = param(zeros<float>({1})); }},
      {"w2 is undefined (a default-constructed Var); x, gamma, w1 and w2 must be defined",
       [](auto& q, auto&) { q.w2 = Var<float>(); }},
  };
  for (const Bad& bad : cases) {
    CAPTURE(bad.problem);
    Params<float> q = p;
    LayerNormMLPOptions o = plain.options;
    o.norm = NormType::layernorm;
    bad.edit(q, o);
    CHECK_THROWS_WITH_AS(node(x, q, o), doctest::Contains(("layernorm_mlp: " + bad.problem).c_str()), Error);
    CHECK_THROWS_WITH_AS(composite(x, q, o), doctest::Contains(("layernorm_mlp_composite: " + bad.problem).c_str()), Error);
  }
  CHECK(node(x, p, plain.options).y.shape() == x.shape());  // and the good arguments run
}

TEST_CASE("layernorm_mlp refuses a scratch tensor too large to address before allocating anything") {
  const Shape x{std::int64_t{1} << 40, 2}, gamma{2}, w1{2, 1, std::int64_t{1} << 30}, w2{std::int64_t{1} << 30, 2};
  const std::int64_t before = host_memory_stats().in_use_bytes;
  CHECK_THROWS_WITH_AS(detail::mlp::check_arguments("layernorm_mlp", {x, gamma, nullptr, w1, nullptr, w2, nullptr},
                                                   DType::f32, {}),
                       doctest::Contains("layernorm_mlp: the dimensions [1099511627776, 1073741824] multiply to more "
                                         "than 2^63 - 1 elements"),
                       Error);
  CHECK(host_memory_stats().in_use_bytes == before);
}

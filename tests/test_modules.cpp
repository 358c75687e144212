// The nn modules LayerNorm, Dense, LayerNormDense, LayerNormMLP and MultiHeadAttention: registration of parameters
// and children, forward against double references, gradcheck with respect to the input and every parameter,
// parameter and compute dtypes, seeding, and errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "project_attend.hpp"
#include "module_support.hpp"

using namespace tapegrad;
using test::parameter_value;
using test::Tolerance;

namespace {

std::vector<std::string> paths(const nn::ParameterList& parameters) {
  std::vector<std::string> out;
  for (const auto& p : parameters) out.push_back(p.path);
  return out;
}

// Self-attention of the module's heads, loop by loop: the qkv columns are q | k | v, each heads × head_dim.
// The attention of an MHA, in double loops over its projection's rows [q heads | k heads | v heads] (turned by rope
// when the config has it), then the output projection.
Tensor<double> reference_attention(const nn::Module& m, const Tensor<double>& x,
                                   const nn::MultiHeadAttentionConfig& config, const std::string& prefix = "") {
  const std::int64_t heads = config.num_heads, kv_heads = config.num_kv_heads ? config.num_kv_heads : heads,
                     head_dim = config.head_dim, columns = heads + 2 * kv_heads;
  Tensor<double> qkv = config.input_norm ? test::reference_norm_dense(m, prefix + "qkv.", x, config.norm)
                                          : test::reference_dense(x, parameter_value(m, prefix + "qkv.kernel"),
                                                                  parameter_value(m, prefix + "qkv.bias"));
  const std::int64_t S = x.dim(-2), width = heads * head_dim, batch = x.numel() / (S * x.dim(-1));
  const std::int64_t group = heads / kv_heads;
  if (config.rope) {  // the q heads and the k head of each kv group turn
    nn::RopeOptions rope = *config.rope;
    rope.rotated_heads = group + 1;
    rope.head_period = group + 2;
    qkv = nn::rope(constant(qkv.reshape({batch, S, columns, head_dim})), rope).value();
  }
  std::vector<std::int64_t> dims = x.shape().to_vector();
  dims.back() = width;
  Tensor<double> attended{Shape(dims)};
  // Element d of q head h's (part 0), or of its kv head's k (1) or v (2), at token s: the columns run kv group by kv
  // group, each group's q heads, its k head, its v head.
  auto at = [&](std::int64_t b, std::int64_t s, std::int64_t part, std::int64_t h, std::int64_t d) {
    const std::int64_t g = h / group, slot = part == 0 ? h % group : group + part - 1;
    return qkv.flat(((b * S + s) * columns + g * (group + 2) + slot) * head_dim + d);
  };
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t i = 0; i < S; ++i) {
        const std::int64_t keys = config.causal ? i + 1 : S;
        std::vector<double> p(static_cast<std::size_t>(keys));
        double max = -INFINITY, total = 0.0;
        for (std::int64_t j = 0; j < keys; ++j) {
          double score = 0.0;
          for (std::int64_t d = 0; d < head_dim; ++d) score += at(b, i, 0, h, d) * at(b, j, 1, h, d);
          p[std::size_t(j)] = score / std::sqrt(double(head_dim));
          max = std::max(max, p[std::size_t(j)]);
        }
        for (double& v : p) total += (v = std::exp(v - max));
        for (std::int64_t d = 0; d < head_dim; ++d) {
          double acc = 0.0;
          for (std::int64_t j = 0; j < keys; ++j) acc += p[std::size_t(j)] / total * at(b, j, 2, h, d);
          attended.flat((b * S + i) * width + h * head_dim + d) = acc;
        }
      }
    }
  }
  return test::reference_dense(attended, parameter_value(m, prefix + "out.kernel"),
                               parameter_value(m, prefix + "out.bias"));
}

// The MLP block, stage by stage: h = norm(x), z = h·W1 + b1 with W1 [H, n, F] as [H, n·F], a = act(z₀)(·z₁),
// y = a·W2 + b2. gelu is the tanh form; swiglu is silu(z₀)·z₁.
Tensor<double> reference_mlp(const nn::Module& m, const Tensor<double>& x, Activation activation,
                             const nn::LayerNormConfig& norm = {}, const std::string& prefix = "") {
  const Tensor<double> w1 = parameter_value(m, prefix + "wi_kernel"), b1 = parameter_value(m, prefix + "wi_bias");
  const std::int64_t H = w1.dim(0), n = w1.dim(1), F = w1.dim(2);
  const Tensor<double> h =
      test::reference_norm(x, parameter_value(m, prefix + "scale"), parameter_value(m, prefix + "ln_bias"), norm);
  const Tensor<double> z = test::reference_dense(h, w1.reshape({H, n * F}), b1.reshape({n * F}));
  std::vector<std::int64_t> dims = x.shape().to_vector();
  dims.back() = F;
  Tensor<double> a{Shape(dims)};
  for (std::int64_t r = 0; r < a.numel() / F; ++r) {
    for (std::int64_t f = 0; f < F; ++f) {
      const double z0 = z.flat(r * n * F + f);
      if (activation == Activation::gelu) {
        const double inner = std::sqrt(2 / std::numbers::pi) * (z0 + 0.044715 * z0 * z0 * z0);
        a.flat(r * F + f) = 0.5 * z0 * (1 + std::tanh(inner));
      } else {
        REQUIRE(activation == Activation::swiglu);
        a.flat(r * F + f) = z0 / (1 + std::exp(-z0)) * z.flat(r * n * F + F + f);
      }
    }
  }
  return test::reference_dense(a, parameter_value(m, prefix + "wo_kernel"), parameter_value(m, prefix + "wo_bias"));
}

// A TransformerLayer: x + attention, then + MLP, then the output norm when the config has one.
Tensor<double> reference_transformer_layer(const nn::Module& m, const Tensor<double>& x,
                                           const nn::TransformerLayerConfig& config) {
  const nn::MultiHeadAttentionConfig attention = nn::detail::attention_config(config);
  const Tensor<double> y = add(constant(x), constant(reference_attention(m, x, attention, "attention."))).value();
  const Tensor<double> z =
      add(constant(y), constant(reference_mlp(m, y, config.activation, config.norm, "mlp."))).value();
  if (!config.output_norm) return z;
  return test::reference_norm(z, parameter_value(m, "output_norm.scale"), parameter_value(m, "output_norm.ln_bias"),
                              config.norm);
}

// Calls body(name, make, input shape, reference) for one of each module with parameters in P and compute dtype C:
// make(seed) builds it, reference(module, x) is its output in double.
template <class P, class C, class Body> void for_each_module(Body body) {
  body(
      "LayerNorm", [](std::uint64_t seed) { return nn::LayerNorm<P, C>(6, {}, seed); }, Shape{2, 3, 6},
      [](const nn::Module& m, const Tensor<double>& x) {
        return test::reference_norm(x, parameter_value(m, "scale"), parameter_value(m, "ln_bias"), {});
      });
  body(
      "Dense", [](std::uint64_t seed) { return nn::Dense<P, C>(6, {.features = 4}, seed); }, Shape{2, 3, 6},
      [](const nn::Module& m, const Tensor<double>& x) {
        return test::reference_dense(x, parameter_value(m, "kernel"), parameter_value(m, "bias"));
      });
  body(
      "LayerNormDense",
      [](std::uint64_t seed) { return nn::LayerNormDense<P, C>(6, {.dense = {.features = 5}}, seed); }, Shape{2, 3, 6},
      [](const nn::Module& m, const Tensor<double>& x) { return test::reference_norm_dense(m, "", x); });
  body(
      "LayerNormMLP",
      [](std::uint64_t seed) { return nn::LayerNormMLP<P, C>(6, {.intermediate_dim = 7}, seed); }, Shape{2, 3, 6},
      [](const nn::Module& m, const Tensor<double>& x) { return reference_mlp(m, x, Activation::gelu); });
  // heads · head_dim = 8 differs from the hidden size 6, so the shapes cannot be confused.
  body(
      "MultiHeadAttention",
      [](std::uint64_t seed) {
        return nn::MultiHeadAttention<P, C>(6, {.num_heads = 2, .head_dim = 4, .causal = true}, seed);
      },
      Shape{2, 3, 6},
      [](const nn::Module& m, const Tensor<double>& x) {
        return reference_attention(m, x, {.num_heads = 2, .head_dim = 4, .causal = true});
      });
  // Grouped-query heads, rotary embeddings and a gated MLP; post-norm in the second.
  for (const bool output_norm : {false, true}) {
    const nn::TransformerLayerConfig config{.num_heads = 4, .num_kv_heads = 2, .head_dim = 2, .ffn_dim = 5,
                                            .activation = Activation::swiglu, .output_norm = output_norm,
                                            .rope = nn::RopeOptions{}};
    body(
        output_norm ? "TransformerLayer, post-norm" : "TransformerLayer",
        [config](std::uint64_t seed) { return nn::TransformerLayer<P, C>(6, config, seed); }, Shape{2, 3, 6},
        [config](const nn::Module& m, const Tensor<double>& x) {
          return reference_transformer_layer(m, x, config);
        });
  }
}

// bf16 compute against the double reference on the same (bf16-exact) input, parameters N(0.3, 0.25): the f32
// parameters rounded to bf16 (2⁻⁹ relative each) and every intermediate (norm, qkv, scores, probabilities, heads)
// rounded once, errors that add up along sums of O(1) terms, so the absolute part scales with the outputs' rms. The
// worst seen is 1.1% of an output of 3.4 (MHA), and 0.032 on a TransformerLayer output of 0.30 where the rms is
// 2.5 (two blocks and two rounded residual sums): 0.57 of this tolerance.
constexpr Tolerance bf16_compute_tolerance{2e-2, 2e-2, true};

}  // namespace

// ---- registration ------------------------------------------------------------------------------------------

TEST_CASE("parameters() lists own parameters, then each child's under its dotted name, in registration order") {
  const nn::MultiHeadAttention<float> attn(8, {.num_heads = 2}, 0);
  CHECK(attn.own_parameters().empty());
  REQUIRE(attn.children().size() == 2);
  CHECK(attn.children()[0].name == "qkv");
  CHECK(attn.children()[1].name == "out");
  CHECK(paths(attn.parameters()) ==
        std::vector<std::string>{"qkv.scale", "qkv.ln_bias", "qkv.kernel", "qkv.bias", "out.kernel", "out.bias"});
  CHECK(paths(attn.qkv().own_parameters()) == std::vector<std::string>{"scale", "ln_bias", "kernel", "bias"});

  const examples::ProjectAttend<float> model(8, {.num_heads = 2}, 0);
  CHECK(paths(model.parameters()) ==
        std::vector<std::string>{"proj.scale", "proj.ln_bias", "proj.kernel", "proj.bias", "attn.qkv.scale",
                                 "attn.qkv.ln_bias", "attn.qkv.kernel", "attn.qkv.bias", "attn.out.kernel",
                                 "attn.out.bias"});
}

TEST_CASE("options without a bias register no bias parameter") {
  CHECK(paths(nn::Dense<float>(4, {.features = 3, .use_bias = false}, 0).parameters()) ==
        std::vector<std::string>{"kernel"});
  CHECK(paths(nn::LayerNorm<float>(4, {.norm_type = NormType::rmsnorm}, 0).parameters()) ==
        std::vector<std::string>{"scale"});
  CHECK(paths(nn::LayerNorm<float>(4, {.use_bias = false}, 0).parameters()) == std::vector<std::string>{"scale"});
  CHECK(paths(nn::MultiHeadAttention<float>(4, {.num_heads = 2, .use_bias = false}, 0).parameters()) ==
        std::vector<std::string>{"qkv.scale", "qkv.ln_bias", "qkv.kernel", "out.kernel"});
}

TEST_CASE("parameters() hands out the module's own Vars") {
  const nn::Dense<float> dense(4, {.features = 3}, 0);
  const auto listed = std::get<Var<float>>(dense.parameters()[0].var);
  CHECK(listed.slot() == dense.kernel().slot());
  CHECK(listed.requires_grad());
}

TEST_CASE("an optimizer over parameters() trains the module in place") {
  const nn::LayerNormDense<double> m(4, {.dense = {.features = 3}}, 0);
  const Tensor<double> kernel = m.kernel().value().clone();
  backward(sum(square(m(constant(randn<double>({5, 4}, 1))))));
  const Tensor<double> grad = m.kernel().grad().clone();
  optim::SGD sgd(m.parameters(), {.lr = 0.5});
  sgd.step();
  for (std::int64_t i = 0; i < kernel.numel(); ++i) {
    CHECK(m.kernel().value().flat(i) == kernel.flat(i) - 0.5 * grad.flat(i));
  }
}

namespace {
// A module that registers by hand, for the registration errors.
struct Registry : nn::Module {
  Var<float> w = param(ones<float>({2}));
  Var<float> undefined;
  nn::Dense<float> child{2, {.features = 2}, 0};
  Registry() : Module("Registry") {
    add_parameter("w", w);
    add_child("child", child);
  }
};
}  // namespace

TEST_CASE("registering a taken, empty or dotted name, an undefined parameter or itself throws naming the module") {
  Registry r;
  CHECK_THROWS_WITH_AS(r.add_parameter("w", r.w), "Registry: the name 'w' is already registered", Error);
  CHECK_THROWS_WITH_AS(r.add_child("child", r.child), "Registry: the name 'child' is already registered", Error);
  CHECK_THROWS_WITH_AS(r.add_parameter("", r.w), doctest::Contains("name '' must be non-empty and contain no '.'"),
                       Error);
  CHECK_THROWS_WITH_AS(r.add_child("a.b", r.child), doctest::Contains("name 'a.b' must be non-empty"), Error);
  CHECK_THROWS_WITH_AS(r.add_parameter("u", r.undefined), "Registry: parameter 'u' is an undefined Var", Error);
  CHECK_THROWS_WITH_AS(r.add_child("me", r), "Registry: a module cannot be its own child ('me')", Error);
  CHECK(paths(r.parameters()) == std::vector<std::string>{"w", "child.kernel", "child.bias"});
}

TEST_CASE("set_parameter points a parameter at a new Var of its dtype and shape, and rejects anything else") {
  nn::LayerNormDense<float> m(4, {.dense = {.features = 3}}, 0);
  const Var<float> kernel = param(randn<float>({4, 3}, 1));
  m.set_parameter("kernel", kernel);
  CHECK(m.kernel().slot() == kernel.slot());
  CHECK(std::get<Var<float>>(m.parameters()[2].var).slot() == kernel.slot());

  CHECK_THROWS_WITH_AS(m.set_parameter("kernel", param(randn<double>({4, 3}, 1))),
                       "LayerNormDense: parameter 'kernel' is f32 but the new value is f64", Error);
  CHECK_THROWS_WITH_AS(m.set_parameter("kernel", param(randn<float>({3, 4}, 1))),
                       "LayerNormDense: parameter 'kernel' has shape [4, 3] but the new value has shape [3, 4]", Error);
  CHECK_THROWS_WITH_AS(m.set_parameter("nope", kernel), "LayerNormDense: no parameter 'nope'", Error);

  nn::MultiHeadAttention<float> attn(4, {.num_heads = 2}, 0);
  const Var<float> out_bias = param(randn<float>({4}, 2));
  attn.set_parameter("out.bias", out_bias);
  CHECK(attn.out().bias().slot() == out_bias.slot());
  CHECK_THROWS_WITH_AS(attn.set_parameter("inner.bias", out_bias),
                       "MultiHeadAttention: no child module 'inner' (in parameter path 'inner.bias')", Error);
}

TEST_CASE("derive_seed depends on both the seed and the name, and only on them") {
  CHECK(nn::derive_seed(3, "kernel") == nn::derive_seed(3, "kernel"));
  CHECK(nn::derive_seed(3, "kernel") != nn::derive_seed(3, "bias"));
  CHECK(nn::derive_seed(3, "kernel") != nn::derive_seed(4, "kernel"));
  CHECK(nn::derive_seed(0, "") != nn::derive_seed(1, ""));
}

// ---- initialization ----------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("parameters are their initializer's tensors, made in P from the derived seeds", P, float, double,
                   bf16, f16) {
  const nn::Dense<P> dense(16, {.features = 8}, 5);
  CHECK(test::bitwise_equal(dense.kernel().value(),
                            Initializer::lecun_normal().make<P>({16, 8}, nn::derive_seed(5, "kernel"))));
  CHECK(test::bitwise_equal(dense.bias().value(), zeros<P>({8})));

  const nn::LayerNorm<P> norm(16, {}, 5);
  CHECK(test::bitwise_equal(norm.scale().value(), ones<P>({16})));
  CHECK(test::bitwise_equal(norm.ln_bias().value(), zeros<P>({16})));
  const nn::LayerNorm<P> centered(16, {.zero_centered_gamma = true}, 5);
  CHECK(test::bitwise_equal(centered.scale().value(), zeros<P>({16})));

  const nn::LayerNormDense<P> custom(16,
                                     {.dense = {.features = 4,
                                                .kernel_init = Initializer::normal(0.02),
                                                .bias_init = Initializer::constant(0.5)},
                                      .norm = {.scale_init = Initializer::constant(2.0),
                                               .ln_bias_init = Initializer::uniform(-1, 1)}},
                                     9);
  CHECK(test::bitwise_equal(custom.kernel().value(),
                            Initializer::normal(0.02).make<P>({16, 4}, nn::derive_seed(9, "kernel"))));
  CHECK(test::bitwise_equal(custom.bias().value(), full<P>({4}, 0.5)));
  CHECK(test::bitwise_equal(custom.scale().value(), full<P>({16}, 2.0)));
  CHECK(test::bitwise_equal(custom.ln_bias().value(),
                            Initializer::uniform(-1, 1).make<P>({16}, nn::derive_seed(9, "ln_bias"))));
}

TEST_CASE("the same seed gives bitwise the same parameters, another seed other kernels") {
  for_each_module<float, void>([](const std::string& name, auto make, const Shape&, auto) {
    CAPTURE(name);
    const auto a = make(11), b = make(11), c = make(12);
    const auto pa = a.parameters(), pb = b.parameters(), pc = c.parameters();
    REQUIRE(pa.size() == pb.size());
    bool any_differs = false;
    for (std::size_t i = 0; i < pa.size(); ++i) {
      CAPTURE(pa[i].path);
      const auto& va = std::get<Var<float>>(pa[i].var).value();
      CHECK(test::bitwise_equal(va, std::get<Var<float>>(pb[i].var).value()));
      any_differs = any_differs || !test::bitwise_equal(va, std::get<Var<float>>(pc[i].var).value());
    }
    const bool has_kernel = name != "LayerNorm";  // LayerNorm's ones and zeros ignore the seed
    CHECK(any_differs == has_kernel);
  });
}

TEST_CASE("a child draws from its own seed: the two projections of MultiHeadAttention differ from a lone one") {
  const nn::MultiHeadAttention<float> attn(4, {.num_heads = 1, .head_dim = 4}, 3);
  const nn::Dense<float> lone(4, {.features = 4}, 3);
  CHECK_FALSE(test::bitwise_equal(attn.out().kernel().value(), lone.kernel().value()));
  CHECK(test::bitwise_equal(attn.out().kernel().value(),
                            Initializer::lecun_normal().make<float>({4, 4}, nn::derive_seed(nn::derive_seed(3, "out"),
                                                                                             "kernel"))));
}

// ---- values and gradients in double -----------------------------------------------------------------------

TEST_CASE("every module matches its double reference and passes gradcheck for its input and parameters") {
  for_each_module<double, void>([](const std::string& name, auto make, const Shape& in, auto reference) {
    CAPTURE(name);
    auto m = make(21);
    test::randomize_parameters(m, 100);
    const Tensor<double> x = randn<double>(in, 22, 0.5, 2.0);
    test::check_close(m(constant(x)).value(), reference(m, x), {1e-12, 1e-12});
    CHECK(test::module_gradcheck(m, x));
  });
}

TEST_CASE("every module passes gradgradcheck for its input and parameters") {
  for_each_module<double, void>([](const std::string& name, auto make, const Shape& in, auto) {
    CAPTURE(name);
    auto m = make(23);
    test::randomize_parameters(m, 110);
    const GradcheckResult result = test::module_gradcheck(m, randn<double>(in, 24, 0.5, 2.0), gradgradcheck);
    CHECK_MESSAGE(result.passed, result.report);
  });
}

TEST_CASE("LayerNorm matches the formula and passes gradcheck for every norm type, bias and gamma setting") {
  for (NormType type : {NormType::layernorm, NormType::rmsnorm}) {
    for (bool use_bias : {false, true}) {
      for (bool zero_centered : {false, true}) {
        CAPTURE(int(type));
        CAPTURE(use_bias);
        CAPTURE(zero_centered);
        const nn::LayerNormConfig config{
            .norm_type = type, .epsilon = 1e-3, .zero_centered_gamma = zero_centered, .use_bias = use_bias};
        nn::LayerNorm<double> norm(5, config, 1);
        test::randomize_parameters(norm, 30);
        const Tensor<double> x = randn<double>({3, 5}, 31, 1.0, 2.0);
        const Tensor<double> want =
            test::reference_norm(x, parameter_value(norm, "scale"), parameter_value(norm, "ln_bias"), config);
        test::check_close(norm(constant(x)).value(), want, {1e-12, 1e-12});
        CHECK(test::module_gradcheck(norm, x));
      }
    }
  }
}

TEST_CASE("Dense contracts the last axis of inputs of any rank, a vector included") {
  nn::Dense<double> dense(3, {.features = 2}, 1);
  test::randomize_parameters(dense, 40);
  for (const Shape& shape : {Shape{3}, Shape{4, 3}, Shape{2, 2, 5, 3}}) {
    CAPTURE(shape);
    const Tensor<double> x = randn<double>(shape, 41);
    const Var<double> y = dense(constant(x));
    const Tensor<double> want =
        test::reference_dense(x, parameter_value(dense, "kernel"), parameter_value(dense, "bias"));
    test::check_close(y.value(), want, {1e-12, 1e-12});
  }
  nn::Dense<double> no_bias(3, {.features = 2, .use_bias = false}, 1);
  test::randomize_parameters(no_bias, 42);
  const Tensor<double> x = randn<double>({4, 3}, 43);
  test::check_close(no_bias(constant(x)).value(), test::reference_dense(x, parameter_value(no_bias, "kernel"), {}),
                    {1e-12, 1e-12});
  CHECK(test::module_gradcheck(no_bias, x));
}

TEST_CASE("LayerNormDense's with_layernorm_output also returns the norm output, and both are differentiable") {
  nn::LayerNormDense<double> m(5, {.dense = {.features = 3}, .norm = {.norm_type = NormType::rmsnorm}}, 1);
  test::randomize_parameters(m, 50);
  const Tensor<double> x = randn<double>({2, 4, 5}, 51);
  const auto [y, h] = m.with_layernorm_output(constant(x));
  const nn::LayerNormConfig rms{.norm_type = NormType::rmsnorm};
  test::check_close(h.value(), test::reference_norm(x, parameter_value(m, "scale"), {}, rms), {1e-12, 1e-12});
  test::check_close(y.value(), test::reference_norm_dense(m, "", x, rms), {1e-12, 1e-12});
  CHECK(test::bitwise_equal(m(constant(x)).value(), y.value()));
  CHECK(test::module_gradcheck(m, x, [](const auto& module, const Var<double>& input) {
    const auto out = module.with_layernorm_output(input);
    return concat<double>({reshape(out.output, {-1}), reshape(out.layernorm_output, {-1})}, 0);
  }));
}

TEST_CASE("MultiHeadAttention matches the double reference with and without the causal mask, on any leading dims") {
  for (bool causal : {false, true}) {
    for (const Shape& shape : {Shape{4, 6}, Shape{2, 5, 6}, Shape{2, 2, 3, 6}}) {
      CAPTURE(causal);
      CAPTURE(shape);
      nn::MultiHeadAttention<double> attn(6, {.num_heads = 3, .causal = causal}, 1);  // head_dim = 6 / 3
      CHECK(attn.config().head_dim == 2);
      test::randomize_parameters(attn, 60);
      const Tensor<double> x = randn<double>(shape, 61);
      test::check_close(attn(constant(x)).value(), reference_attention(attn, x, attn.config()), {1e-12, 1e-12});
    }
  }
}

TEST_CASE("MultiHeadAttention passes gradcheck for its input and parameters, causal or not") {
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    nn::MultiHeadAttention<double> attn(4, {.num_heads = 2, .head_dim = 3, .causal = causal}, 1);
    test::randomize_parameters(attn, 70);
    CHECK(test::module_gradcheck(attn, randn<double>({2, 3, 4}, 71)));
  }
}

TEST_CASE("MultiHeadAttention with grouped-query heads, rope and no input norm matches the double reference") {
  const std::vector<nn::MultiHeadAttentionConfig> configs{
      {.num_heads = 4, .num_kv_heads = 2, .head_dim = 3, .causal = true},
      {.num_heads = 4, .num_kv_heads = 1, .head_dim = 4, .rope = nn::RopeOptions{.rotary_dim = 2}},
      {.num_heads = 2, .head_dim = 4, .causal = true, .rope = nn::RopeOptions{.interleaved = true},
       .input_norm = false},
  };
  for (std::size_t c = 0; c < configs.size(); ++c) {
    CAPTURE(c);
    nn::MultiHeadAttention<double> attn(6, configs[c], 1);
    test::randomize_parameters(attn, 62);
    const Tensor<double> x = randn<double>({2, 5, 6}, 63);
    test::check_close(attn(constant(x)).value(), reference_attention(attn, x, attn.config()), {1e-12, 1e-12});
    CHECK(test::module_gradcheck(attn, x));
  }
}

TEST_CASE("MultiHeadAttention's padded tokens leave the valid ones as a shorter sequence gives them") {
  nn::MultiHeadAttention<double> attn(6, {.num_heads = 2, .num_kv_heads = 1, .causal = true}, 1);
  test::randomize_parameters(attn, 64);
  const Tensor<double> x = randn<double>({2, 7, 6}, 65);
  const Tensor<double> y = attn(constant(x), {.lengths = {7, 4}}).value();
  const Tensor<double> short_y = attn(constant(slice(constant(x), 1, 0, 4).value())).value();
  for (std::int64_t s = 0; s < 4; ++s) {
    for (std::int64_t j = 0; j < 6; ++j) CHECK(y(1, s, j) == doctest::Approx(short_y(1, s, j)).epsilon(1e-12));
  }
}

TEST_CASE("MultiHeadAttention's dropout runs in the calls that give a seed, the same mask for the same seed") {
  nn::MultiHeadAttention<double> attn(6, {.num_heads = 2, .dropout = 0.3}, 1);
  test::randomize_parameters(attn, 66);
  const Var<double> x = constant(randn<double>({2, 5, 6}, 67));
  const Tensor<double> plain = attn(x).value(), dropped = attn(x, {.dropout_seed = 9}).value();
  CHECK_FALSE(test::bitwise_equal(plain, dropped));
  CHECK(test::bitwise_equal(dropped, attn(x, {.dropout_seed = 9}).value()));
  CHECK(test::module_gradcheck(attn, x.value(), [](const auto& module, const Var<double>& input) {
    return module(input, {.dropout_seed = 9});
  }));
}

TEST_CASE("a causal MultiHeadAttention's outputs before a token do not depend on it; a full one's do") {
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const nn::MultiHeadAttention<float> attn(8, {.num_heads = 2, .causal = causal}, 1);
    const std::int64_t S = 6, H = 8, changed = 3;
    const Tensor<float> x = randn<float>({2, S, H}, 80);
    Tensor<float> x_changed = x.clone();
    // Not the same shift for every feature: the input norm would take that out (up to rounding).
    for (std::int64_t j = 0; j < H; ++j) x_changed(1, changed, j) += 0.5f * static_cast<float>(j + 1);
    const Tensor<float> y = attn(constant(x)).value(), y_changed = attn(constant(x_changed)).value();
    for (std::int64_t s = 0; s < S; ++s) {
      bool same = true;
      for (std::int64_t j = 0; j < H; ++j) same = same && y(1, s, j) == y_changed(1, s, j);
      CAPTURE(s);
      CHECK(same == (s < changed && causal));
    }
  }
}

TEST_CASE("LayerNormMLP with a gated activation and rmsnorm matches the reference, norm output included") {
  const nn::LayerNormConfig rms{.norm_type = NormType::rmsnorm, .zero_centered_gamma = true};
  nn::LayerNormMLP<double> mlp(5, {.intermediate_dim = 3, .activation = Activation::swiglu, .norm = rms}, 1);
  CHECK(paths(mlp.parameters()) ==
        std::vector<std::string>{"scale", "wi_kernel", "wi_bias", "wo_kernel", "wo_bias"});
  CHECK(mlp.wi_kernel().shape() == Shape{5, 2, 3});
  CHECK(mlp.wi_bias().shape() == Shape{2, 3});
  test::randomize_parameters(mlp, 110);
  const Tensor<double> x = randn<double>({2, 4, 5}, 111);
  const auto [y, h] = mlp.with_layernorm_output(constant(x));
  test::check_close(y.value(), reference_mlp(mlp, x, Activation::swiglu, rms), {1e-12, 1e-12});
  test::check_close(h.value(), test::reference_norm(x, parameter_value(mlp, "scale"), {}, rms), {1e-12, 1e-12});
  CHECK(test::bitwise_equal(mlp(constant(x)).value(), y.value()));
  CHECK(test::module_gradcheck(mlp, x, [](const auto& module, const Var<double>& input) {
    const auto out = module.with_layernorm_output(input);
    return concat<double>({reshape(out.output, {-1}), reshape(out.layernorm_output, {-1})}, 0);
  }));
}

TEST_CASE("LayerNormMLP's kernels are drawn with the fans of their matrices, and use_bias = false drops the biases") {
  const nn::LayerNormMLP<bf16> mlp(16, {.intermediate_dim = 32, .activation = Activation::geglu}, 4);
  CHECK(test::bitwise_equal(mlp.wi_kernel().value(),
                            Initializer::lecun_normal().make<bf16>({16, 2, 32}, nn::derive_seed(4, "wi_kernel"),
                                                                   {.in = {0}, .out = {2}, .batch = {1}})));
  CHECK(test::bitwise_equal(mlp.wo_kernel().value(),
                            Initializer::lecun_normal().make<bf16>({32, 16}, nn::derive_seed(4, "wo_kernel"))));
  const nn::LayerNormMLP<float> no_bias(4, {.intermediate_dim = 8, .use_bias = false}, 0);
  CHECK(paths(no_bias.parameters()) == std::vector<std::string>{"scale", "ln_bias", "wi_kernel", "wo_kernel"});
  CHECK_THROWS_WITH_AS(nn::LayerNormMLP<float>(4, {.intermediate_dim = 0}, 0),
                       "LayerNormMLP: intermediate_dim must be positive, got 0", Error);
  CHECK_THROWS_WITH_AS(no_bias(constant(zeros<float>({2, 5}))),
                       doctest::Contains("LayerNormMLP: input of shape [2, 5] has 5 features"), Error);
}

// ---- dtypes ------------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("a module creates its parameters in P, computes in its input's P and sends gradients in P", P,
                   float, double, bf16, f16) {
  for_each_module<P, void>([](const std::string& name, auto make, const Shape& in, auto reference) {
    CAPTURE(name);
    const auto m = make(1);
    const Tensor<P> x = randn<P>(in, 2);
    const Var<P> y = m(param(x));
    CHECK(y.shape() == reference(m, cast<double>(x)).shape());
    backward(sum(y));
    for (const nn::NamedParameter& p : m.parameters()) {
      CAPTURE(p.path);
      CHECK(p.dtype() == dtype_v<P>);
      CHECK(p.bytes() == p.numel() * std::int64_t(sizeof(P)));
      const auto& grad = std::get<Var<P>>(p.var).grad();
      REQUIRE(grad.defined());
      CHECK(grad.shape() == p.shape());
    }
  });
}

TEST_CASE("f32 parameters with bf16 compute: bf16 output near the double reference, f32 parameter gradients") {
  for_each_module<float, bf16>([](const std::string& name, auto make, const Shape& in, auto reference) {
    CAPTURE(name);
    auto m = make(1);
    test::randomize_parameters(m, 90, 0.5);
    const Tensor<float> x = cast<float>(randn<bf16>(in, 91));  // bf16-exact, so the cast to bf16 is exact
    const Var<float> input = param(x);
    const Var<bf16> y = m(input);
    test::check_close(y.value(), reference(m, cast<double>(x)), bf16_compute_tolerance);
    backward(sum(y));
    CHECK(input.grad().defined());  // back through the cast, in the input's f32
    for (const nn::NamedParameter& p : m.parameters()) {
      CAPTURE(p.path);
      CHECK(p.dtype() == DType::f32);
      const Tensor<float>& grad = std::get<Var<float>>(p.var).grad();
      REQUIRE(grad.defined());
      CHECK(grad.shape() == p.shape());
      CHECK(std::all_of(grad.span().begin(), grad.span().end(), [](float g) { return std::isfinite(g); }));
    }
  });
}

TEST_CASE("a module with compute dtype C returns C whatever its input's dtype; with C = void, the input's") {
  const nn::Dense<bf16, float> dense(4, {.features = 2}, 0);
  CHECK(dense(constant(randn<f16>({3, 4}, 1))).dtype() == DType::f32);
  CHECK(dense(constant(randn<double>({3, 4}, 1))).dtype() == DType::f32);
  const nn::LayerNorm<bf16> norm(4, {}, 0);
  CHECK(norm(constant(randn<double>({3, 4}, 1))).dtype() == DType::f64);
  CHECK(norm(constant(randn<f16>({3, 4}, 1))).dtype() == DType::f16);
}

// ---- errors ------------------------------------------------------------------------------------------------

TEST_CASE("modules reject inputs of the wrong size, naming the module and the shape") {
  const nn::Dense<float> dense(4, {.features = 2}, 0);
  CHECK_THROWS_WITH_AS(dense(constant(zeros<float>({2, 5}))),
                       "Dense: input of shape [2, 5] has 5 features in its last axis but the module was built for 4",
                       Error);
  CHECK_THROWS_WITH_AS(dense(constant(zeros<float>({}))),
                       "Dense: input of shape [] should have at least 1 axis, the last of size 4", Error);
  CHECK_THROWS_WITH_AS(nn::LayerNorm<float>(4, {}, 0)(constant(zeros<float>({3}))),
                       doctest::Contains("LayerNorm: input of shape [3] has 3 features"), Error);
  CHECK_THROWS_WITH_AS(nn::LayerNormDense<float>(4, {.dense = {.features = 2}}, 0)(constant(zeros<float>({1, 8}))),
                       doctest::Contains("LayerNormDense: input of shape [1, 8] has 8 features"), Error);
  const nn::MultiHeadAttention<float> attn(4, {.num_heads = 2}, 0);
  CHECK_THROWS_WITH_AS(attn(constant(zeros<float>({4}))),
                       "MultiHeadAttention: input of shape [4] should have at least 2 axes, the last of size 4", Error);
  CHECK_THROWS_WITH_AS(attn(constant(zeros<float>({2, 3, 6}))),
                       doctest::Contains("MultiHeadAttention: input of shape [2, 3, 6] has 6 features"), Error);
}

TEST_CASE("configurations that cannot work throw naming the module and the sizes") {
  CHECK_THROWS_WITH_AS(nn::Dense<float>(4, {}, 0), "Dense: input size and features must be positive, got 4 and 0",
                       Error);
  CHECK_THROWS_WITH_AS(nn::LayerNorm<float>(0, {}, 0), "LayerNorm: the hidden size must be positive, got 0", Error);
  CHECK_THROWS_WITH_AS(nn::MultiHeadAttention<float>(6, {}, 0),
                       "MultiHeadAttention: hidden size and num_heads must be positive, got 6 and 0", Error);
  CHECK_THROWS_WITH_AS(nn::MultiHeadAttention<float>(6, {.num_heads = 4}, 0),
                       "MultiHeadAttention: hidden size 6 is not divisible by num_heads 4; set head_dim to choose the "
                       "head size",
                       Error);
  CHECK_THROWS_WITH_AS(nn::MultiHeadAttention<float>(6, {.num_heads = 4, .head_dim = -1}, 0),
                       doctest::Contains("head_dim must be positive"), Error);
  CHECK(nn::MultiHeadAttention<float>(6, {.num_heads = 4, .head_dim = 5}, 0).config().head_dim == 5);
  CHECK_THROWS_WITH_AS(nn::MultiHeadAttention<float>(8, {.num_heads = 4, .num_kv_heads = 3}, 0),
                       "MultiHeadAttention: num_kv_heads 3 must divide num_heads 4", Error);
  CHECK_THROWS_WITH_AS(nn::TransformerLayer<float>(8, {.num_heads = 2}, 0),
                       "TransformerLayer: ffn_dim must be positive, got 0", Error);
}

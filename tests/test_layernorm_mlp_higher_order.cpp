// layernorm_mlp twice differentiable: gradgradcheck in double over every option, Hessian-vector products of a loss
// through the node against finite differences of its fused gradients, low and mixed precision against double, and
// the refusal of fp8. Inputs are fresh random draws each run (the seed is reported on failure).
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "higher_order_cases.hpp"
#include "mlp_cases.hpp"
#include "mlp_hvp.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using namespace tapegrad::mlp_test;

using tapegrad::higher_order_test::fresh_seed;
using tapegrad::higher_order_test::numeric_hvp;

TEST_CASE("layernorm_mlp passes gradgradcheck in double for every activation, norm, gamma form, bias and policy") {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  for_each_case([&](const Case& c) {
    const Params<double> p = make_params<double>(c, 4, 3, seed);
    const auto f = [&](const std::vector<Var<double>>& in) { return node(in[0], params_from(c, in), c.options).y; };
    // The policies differ in the first backward only (compared with the recorded gradient by gradgradcheck): the
    // full Jacobian of the gradient for one of them, random projections for the others.
    const GradcheckResult result = gradgradcheck(f, values_of(randn<double>({2, 3, 4}, seed + 7, 0.2, 1.2), p),
                                                 {.fast_mode = c.options.recompute != Recompute::save_all});
    CHECK_MESSAGE(result.passed, result.report);
  });
}

TEST_CASE("the returned norm output is twice differentiable too") {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  for (Activation act : all_activations) {
    for (NormType norm : {NormType::layernorm, NormType::rmsnorm}) {
      const Case c{.options = {.norm = norm, .activation = act, .return_layernorm_output = true}};
      const std::string what = describe(c);
      CAPTURE(what);
      const Params<double> p = make_params<double>(c, 5, 4, seed);
      const GradcheckResult result = gradgradcheck(
          [&](const std::vector<Var<double>>& in) {
            const auto out = node(in[0], params_from(c, in), c.options);
            return Var<double>(out.y * 2.0 + out.layernorm_output * out.layernorm_output);
          },
          values_of(randn<double>({3, 5}, seed + 9), p));
      CHECK_MESSAGE(result.passed, result.report);
    }
  }
}

TEST_CASE("clamped_swiglu's clamps hold in its second derivative") {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  // With limit 0.3 and z ~ N(0, 1) both clamps act on many elements (a clamped element's curvature is zero).
  const Case c{.options = {.activation = Activation::clamped_swiglu, .clamped_swiglu = {0.3, 1.702}}};
  const Params<double> p = make_params<double>(c, 6, 5, seed);
  const GradcheckResult result =
      gradgradcheck([&](const std::vector<Var<double>>& in) { return node(in[0], params_from(c, in), c.options).y; },
                    values_of(randn<double>({4, 6}, seed + 1, 0.0, 2.0), p));
  CHECK_MESSAGE(result.passed, result.report);
}

TEST_CASE("a Hessian-vector product through the node equals finite differences of its fused gradients") {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  for (Activation act : {Activation::gelu, Activation::swiglu, Activation::squared_relu}) {
    const Case c{.options = {.norm = NormType::rmsnorm, .zero_centered_gamma = true, .activation = act}};
    const std::string what = describe(c);
    CAPTURE(what);
    const Params<double> p = make_params<double>(c, 8, 6, seed);
    const std::vector<Tensor<double>> x = values_of(randn<double>({2, 3, 8}, seed + 11), p);
    std::vector<Tensor<double>> v;
    for (std::size_t k = 0; k < x.size(); ++k) v.push_back(randn<double>(x[k].shape(), seed + 20 + k));
    const auto loss = [&](const std::vector<Var<double>>& in) {
      return weighted_loss(node(in[0], params_from(c, in), c.options), seed);
    };
    // The numeric side's gradients come from the node's fused backward.
    const std::vector<Tensor<double>> hv = hvp<double>(loss, x, v), numeric = numeric_hvp(loss, x, v);
    for (std::size_t k = 0; k < x.size(); ++k) {
      CAPTURE(k);
      test::check_close(hv[k], numeric[k], {1e-6, 1e-7});
    }
  }
}

// The create_graph backward runs the composite in the node's compute dtype T on the values it is given (parameters
// in another dtype cast to T), as PyTorch's double backward runs an unfused block; its second derivatives are
// compared with the double node's on the same values (inputs, weights and directions rounded to the low precision
// first), by relative error (‖got - want‖₂ / ‖want‖₂) over 20 random draws each. Tolerances (measured worst over
// 120 draws in brackets): f32 1e-5 [9.4e-7]; bf16 3e-2 [1.7e-2], every intermediate value rounded to 8 bits; f16
// 4e-3 [1.5e-3].
TEST_CASE("low and mixed precision: the node's second derivatives match the double node's") {
  double worst[4] = {};
  for (int draw = 0; draw < 20; ++draw) {
    const std::uint64_t seed = fresh_seed();
    CAPTURE(seed);
    for (Activation act : {Activation::gelu, Activation::swiglu}) {
      const Case c{.options = {.activation = act}};
      CAPTURE(activation_name(act));
      const Params<double> drawn = make_params<double>(c, 16, 24, seed);
      const auto check = [&]<class T, class P>(double tolerance, double& worst_here) {
        CAPTURE(dtype_name(dtype_v<T>));
        CAPTURE(dtype_name(dtype_v<P>));
        const Params<P> p = params_in<P>(drawn);
        const Params<double> same = params_in<double>(p);
        const Tensor<double> x = rounded_to<T>(randn<double>({3, 4, 16}, seed + 3, 0.5, 2.0));
        const Tensor<double> w = rounded_to<T>(randn<double>({3, 4, 16}, seed + 4));
        std::vector<Tensor<double>> v{rounded_to<T>(randn<double>(x.shape(), seed + 5))};
        for (const Var<double>& q : defined_params(same)) {
          v.push_back(rounded_to<P>(randn<double>(q.shape(), seed + 6 + v.size())));
        }
        const std::vector<Tensor<double>> got = node_hvp(c, param(cast<T>(x)), p, w, v);
        const std::vector<Tensor<double>> want = node_hvp(c, param(x), same, w, v);
        for (std::size_t k = 0; k < want.size(); ++k) {
          CAPTURE(k);
          const double error = test::relative_error(got[k], want[k]);
          CHECK(error <= tolerance);
          worst_here = std::max(worst_here, error);
        }
      };
      check.operator()<float, float>(1e-5, worst[0]);
      check.operator()<float, double>(1e-5, worst[1]);
      check.operator()<bf16, float>(3e-2, worst[2]);
      check.operator()<f16, f16>(4e-3, worst[3]);
    }
  }
  MESSAGE("worst relative errors: f32 ", worst[0], ", f32 with f64 parameters ", worst[1], ", bf16 ", worst[2],
          ", f16 ", worst[3]);
}

TEST_CASE("an fp8 node refuses a create_graph backward, naming fp8, and the tape stays usable") {
  Case c{.options = {.activation = Activation::gelu}};
  c.options.fp8 = Fp8Quantization{.recipe = fp8::CurrentScaling{}};
  const Params<float> p = make_params<float>(c, 16, 32, 1);
  const Var<float> x = param(randn<float>({4, 16}, 2));
  const Var<float> loss = weighted_loss(node(x, p, c.options), 3);
  CHECK_THROWS_WITH_AS(backward(loss, {.create_graph = true}),
                       doctest::Contains("layernorm_mlp: a create_graph backward (a derivative of the gradients) is "
                                         "not available with fp8 quantization"),
                       AutodiffError);
  backward(loss);  // the refused pass left nothing behind
  CHECK(x.grad().defined());
  CHECK(p.w1.grad().defined());
}

// Second derivatives on the GPU against the cpu's: Hessian-vector products of every op family's table
// (higher_order_cases.hpp) and of the layernorm_mlp node in every activation and norm, in double on the same inputs
// (the same algorithms: they agree to rounding, relative error ≤ 1e-10; measured worst 3.6e-16 for the tables,
// 5.4e-16 for the node), and the node's in f32 and bf16 against the cpu's in double on the values rounded to those
// dtypes, by relative error ‖gpu - cpu‖ / ‖cpu‖: f32 ≤ 1e-5 [2.9e-7]; bf16, whose composite rounds every
// intermediate value to 8 bits, ≤ 3e-2 as on the cpu (tests/test_layernorm_mlp_higher_order.cpp), and ≤ 0.25 with
// kinks (relu's, the clamps), where a z next to one can cross it when rounded [bf16 over every activation: 1.9e-1].
// Brackets: the worst of one H200 run.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "gpu_reference.hpp"
#include "higher_order_cases.hpp"
#include "mlp_hvp.hpp"
#include "support.hpp"

using namespace tapegrad;
using test::gpu;

namespace {

std::vector<Tensor<double>> on(const std::vector<Tensor<double>>& tensors, Device device) {
  std::vector<Tensor<double>> moved;
  for (const Tensor<double>& t : tensors) moved.push_back(t.to(device));
  return moved;
}

// The largest relative error over the tensors of a product.
double worst_error(const std::vector<Tensor<double>>& got, const std::vector<Tensor<double>>& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t k = 0; k < want.size(); ++k) {
    worst = std::max(worst, test::relative_error(got[k].to(Device::cpu()), want[k]));
  }
  return worst;
}

void compare_tables(const std::vector<higher_order_test::Case>& on_cpu,
                    const std::vector<higher_order_test::Case>& on_gpu, double& worst) {
  for (std::size_t i = 0; i < on_cpu.size(); ++i) {
    const higher_order_test::Case& c = on_cpu[i];
    const std::uint64_t seed = higher_order_test::fresh_seed();
    CAPTURE(c.name);
    CAPTURE(seed);
    const std::vector<Tensor<double>> x = higher_order_test::inputs_for(c, seed);
    const std::vector<Tensor<double>> v = higher_order_test::inputs_for(c, seed + 1000);
    const double error = worst_error(hvp(on_gpu[i].f, on(x, gpu), on(v, gpu)), hvp(c.f, x, v));
    CHECK(error <= 1e-10);
    worst = std::max(worst, error);
  }
}

// Activations with kinks (relu's, the clamps): an element of z next to one, rounded to bf16, can cross it.
bool kinked(Activation act) {
  return act == Activation::relu || act == Activation::squared_relu || act == Activation::reglu ||
         act == Activation::sreglu || act == Activation::clamped_swiglu;
}

}  // namespace

TEST_CASE("every op family's Hessian-vector products on the GPU equal the cpu's in double") {
  using namespace higher_order_test;
  double worst = 0;
  compare_tables(elementwise_cases(), elementwise_cases(), worst);
  compare_tables(tensor_cases(), tensor_cases(), worst);
  compare_tables(norm_and_loss_cases(), norm_and_loss_cases(gpu), worst);
  std::printf("op tables: worst relative error of the GPU's Hessian-vector products %.1e\n", worst);
}

// The norms' fused second derivatives (cuda/norm.cu) at row lengths of each kernel variant: a warp per row, packs
// and single elements (37), a block per row (1500, 2048).
TEST_CASE("the norms' second derivatives on the GPU equal the cpu's in double, for short, odd and long rows") {
  for (const std::int64_t H : {37, 64, 1500, 2048}) {
    for (const bool rms : {false, true}) {
      const higher_order_test::F f = [rms](const higher_order_test::Inputs& in) {
        const Var<double> h = rms ? rmsnorm(in[0], in[1], {.epsilon = 1e-3})
                                  : layernorm(in[0], in[1], in[2], {.epsilon = 1e-3, .zero_centered_gamma = true});
        return sum(tanh(h) * in[0]);
      };
      const higher_order_test::Case c{"norm", f, {{9, H}, {H}, {H}}};
      const std::uint64_t seed = higher_order_test::fresh_seed();
      CAPTURE(H);
      CAPTURE(rms);
      CAPTURE(seed);
      const std::vector<Tensor<double>> x = higher_order_test::inputs_for(c, seed);
      const std::vector<Tensor<double>> v = higher_order_test::inputs_for(c, seed + 1000);
      CHECK(worst_error(hvp(f, on(x, gpu), on(v, gpu)), hvp(f, x, v)) <= 1e-10);
    }
  }
}

TEST_CASE("the node's second derivatives on the GPU equal the cpu's: in double, and in f32 and bf16") {
  using namespace mlp_test;
  const std::uint64_t seed = higher_order_test::fresh_seed();
  CAPTURE(seed);
  double worst_f64 = 0, worst_f32 = 0, worst_bf16 = 0, worst_bf16_kinked = 0;
  for (Activation act : all_activations) {
    for (NormType norm : {NormType::layernorm, NormType::rmsnorm}) {
      const Case c{.options = {.norm = norm, .zero_centered_gamma = norm == NormType::rmsnorm, .activation = act}};
      const std::string what = describe(c);
      CAPTURE(what);
      const Params<double> drawn = make_params<double>(c, 16, 24, seed);
      // Inputs, weights and directions rounded to T (P for the parameters' directions), the same on both sides.
      const auto compare = [&]<class T, class P>(double tolerance, double& worst) {
        const Params<P> p = params_in<P>(drawn);
        const Tensor<double> x = rounded_to<T>(randn<double>({3, 5, 16}, seed + 3, 0.5, 2.0));
        const Tensor<double> w = rounded_to<T>(randn<double>(x.shape(), seed + 4));
        std::vector<Tensor<double>> v{rounded_to<T>(randn<double>(x.shape(), seed + 5))};
        for (const Var<P>& q : defined_params(p))
          v.push_back(rounded_to<P>(randn<double>(q.shape(), seed + 6 + v.size())));
        const std::vector<Tensor<double>> want = node_hvp(c, param(x), params_in<double>(p), w, v);
        const double error = worst_error(node_hvp(c, param(cast<T>(x).to(gpu)), params_in<P>(p, gpu), w, v), want);
        CHECK(error <= tolerance);
        worst = std::max(worst, error);
      };
      compare.operator()<double, double>(1e-10, worst_f64);
      compare.operator()<float, float>(1e-5, worst_f32);
      if (kinked(act)) {
        compare.operator()<bf16, float>(0.25, worst_bf16_kinked);
      } else {
        compare.operator()<bf16, float>(3e-2, worst_bf16);
      }
    }
  }
  std::printf(
      "layernorm_mlp: worst relative error of the GPU's Hessian-vector products f64 %.1e, f32 %.1e, bf16 %.1e (with "
      "kinks %.1e)\n",
      worst_f64, worst_f32, worst_bf16, worst_bf16_kinked);
}

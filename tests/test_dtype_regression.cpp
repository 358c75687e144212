// Issue 3's regression: a model of LayerNormDense (128 features) then MultiHeadAttention (8 heads of 128) on an
// input [8, 16, 128] must keep every parameter in the dtype asked for (bf16 parameters once came out as f32), return
// the compute dtype, and send every parameter a gradient in the parameters' dtype.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "project_attend.hpp"
#include "support.hpp"

using namespace tapegrad;

namespace {

const nn::MultiHeadAttentionConfig attention{.num_heads = 8, .head_dim = 128, .causal = true};
const Shape input_shape{8, 16, 128};

// Runs the scenario for parameters P, compute C and input T: every parameter in P, the output in the compute dtype
// of shape [8, 16, 128], every parameter's gradient defined and finite after backward, and summary totals of
// sizeof(P) bytes per parameter.
template <class P, class C, class T> void check_scenario() {
  using Out = nn::compute_of<C, T>;
  const examples::ProjectAttend<P, C> model(128, attention, /*seed=*/3);
  const nn::ParameterList parameters = model.parameters();
  REQUIRE(parameters.size() == 10);
  std::int64_t numel = 0;
  for (const nn::NamedParameter& p : parameters) {
    CAPTURE(p.path);
    CHECK(dtype_name(p.dtype()) == dtype_name(dtype_v<P>));
    numel += p.numel();
  }

  const Var<Out> y = model(constant(randn<T>(input_shape, 4)));
  CHECK(dtype_name(y.dtype()) == dtype_name(dtype_v<Out>));
  CHECK(y.shape() == input_shape);

  backward(mean(y));
  for (const nn::NamedParameter& p : parameters) {
    CAPTURE(p.path);
    const Tensor<P>& grad = std::get<Var<P>>(p.var).grad();
    REQUIRE(grad.defined());
    CHECK(grad.dtype() == dtype_v<P>);
    CHECK(grad.shape() == p.shape());
    CHECK(std::all_of(grad.span().begin(), grad.span().end(), [](P g) { return std::isfinite(float(g)); }));
  }

  const nn::ModelSummary summary = nn::summarize(model, randn<T>(input_shape, 5));
  CHECK(summary.parameter_count == numel);
  CHECK(summary.parameter_bytes == numel * std::int64_t(sizeof(P)));
}

}  // namespace

TEST_CASE("bf16 input and bf16 parameters: every parameter, the output and every gradient are bf16") {
  check_scenario<bf16, void, bf16>();
}

TEST_CASE("f16 input and f16 parameters: every parameter, the output and every gradient are f16") {
  check_scenario<f16, void, f16>();
}

TEST_CASE("f32 input and f32 parameters: every parameter, the output and every gradient are f32") {
  check_scenario<float, void, float>();
}

TEST_CASE("f32 parameters with bf16 compute: parameters and their gradients f32, the output bf16") {
  check_scenario<float, bf16, float>();
  check_scenario<float, bf16, bf16>();
}

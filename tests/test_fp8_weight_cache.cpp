// The fp8 weight cache (ops/fp8/weight_cache.hpp) on the CPU: micro-batches after the first reuse the weights'
// copies (bitwise the results of quantizing them again where the scale is the same), delayed scaling records no
// amax for a weight it did not quantize, another tensor is quantized afresh, a change in place shows only after
// clear(); modules with `.fp8_weight_cache` clear theirs on parameters_changed() and load_state_dict.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>

#include "fp8_mlp_cases.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using namespace tapegrad::mlp_test;

namespace {

Fp8Quantization cached(const fp8::Recipe& recipe) {
  Fp8Quantization q = fp8_quantization(recipe);
  q.weight_cache = std::make_shared<fp8::WeightCache>();
  return q;
}

}  // namespace

TEST_CASE("fp8_dense with a weight cache quantizes the kernel once, and again for another tensor or after clear()") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  const Tensor<float> dy = randn<float>({6, 12}, seed);
  const Var<float> kernel = param(randn<float>({8, 12}, seed + 1, 0.0, 0.3));
  for (const fp8::Recipe& recipe : {fp8::Recipe{fp8::CurrentScaling{}}, fp8::Recipe{fp8::BlockScaling{}}}) {
    CAPTURE(fp8::describe(recipe));
    const Fp8Quantization q = cached(recipe), plain = fp8_quantization(recipe);
    const auto step = [&](Var<float> w, const Fp8Quantization& with, std::uint64_t s) {
      const Var<float> x = param(randn<float>({6, 8}, s));
      const Var<float> y = fp8_dense(x, w, Var<float>(), with);
      backward(sum(y * constant(dy)));
      const std::vector<Tensor<float>> out{y.value(), x.grad(), w.grad()};
      w.zero_grad();
      return out;
    };
    const auto same = [](const std::vector<Tensor<float>>& a, const std::vector<Tensor<float>>& b) {
      for (std::size_t i = 0; i < a.size(); ++i) CHECK(test::bitwise_equal(a[i], b[i]));
    };
    for (std::uint64_t micro_batch = 0; micro_batch < 3; ++micro_batch) {
      same(step(kernel, q, seed + 2 + micro_batch), step(kernel, plain, seed + 2 + micro_batch));
    }
    CHECK(q.weight_cache->copies_made() == 1);

    const Var<float> other = param(randn<float>({8, 12}, seed + 9, 0.0, 0.3));
    same(step(other, q, seed + 5), step(other, plain, seed + 5));
    CHECK(q.weight_cache->copies_made() == 2);

    const std::vector<Tensor<float>> before = step(other, q, seed + 6);
    Tensor<float> in_place = other.value();  // (shares the parameter's storage)
    in_place.flat(0) += 1.0f;                // the cache still holds the old copy
    same(step(other, q, seed + 6), before);
    q.weight_cache->clear();
    same(step(other, q, seed + 6), step(other, plain, seed + 6));
    CHECK(q.weight_cache->copies_made() == 3);
  }
}

TEST_CASE("layernorm_mlp with a weight cache under delayed scaling records the weights' amaxes once") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  for (Recompute policy : all_policies) {
    CAPTURE(recompute_name(policy));
    const Case c{.options = {.activation = Activation::swiglu, .recompute = policy}};
    const Params<float> p = make_params<float>(c, 16, 24, seed);
    LayerNormMLPOptions o = c.options;
    o.fp8 = cached(fp8::DelayedScaling{.amax_history_len = 4});
    const fp8::ScalingState& state = *o.fp8->state;
    step(randn<float>({5, 16}, seed + 1), p, o, seed + 2);
    CHECK(state.amax_history(fp8::Role::kernel1)[0] > 0.0f);
    CHECK(state.amax_history(fp8::Role::kernel2)[0] > 0.0f);
    const Step<float, float> reused = step(randn<float>({5, 16}, seed + 3), p, o, seed + 4);
    CHECK(o.fp8->weight_cache->copies_made() == 2);
    CHECK(state.amax_history(fp8::Role::kernel1)[0] == 0.0f);  // the second micro-batch quantized no weight
    CHECK(state.amax_history(fp8::Role::kernel2)[0] == 0.0f);
    CHECK(state.amax_history(fp8::Role::input)[0] > 0.0f);
    CHECK(state.amax_history(fp8::Role::grad_hidden)[0] > 0.0f);
    for (const Tensor<float>& g : reused.grads) CHECK(std::isfinite(test::moments(g).max));
  }
}

TEST_CASE("a module's fp8 weight cache lives until parameters_changed() or load_state_dict") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  nn::LayerNormMLP<float> mlp(16, {.intermediate_dim = 24, .fp8 = fp8::CurrentScaling{}, .fp8_weight_cache = true},
                              seed);
  const nn::LayerNormMLP<float> twin(16, {.intermediate_dim = 24, .fp8 = fp8::CurrentScaling{}}, seed);
  const Var<float> x = constant(randn<float>({4, 16}, seed + 1));
  CHECK(test::bitwise_equal(mlp(x).value(), twin(x).value()));
  mlp(x);
  CHECK(nn::summary(mlp, x.value()).find("fp8 weight copies made: 2") != std::string::npos);

  for (const nn::NamedParameter& p : mlp.parameters()) {  // as an optimizer's step: in place
    if (p.path != "wo_kernel") continue;
    Tensor<float> w = std::get<Var<float>>(p.var).value();
    w.flat(0) += 0.5f;
  }
  const Tensor<float> stale = mlp(x).value();
  mlp.parameters_changed();
  const Tensor<float> fresh = mlp(x).value();
  CHECK_FALSE(test::bitwise_equal(stale, fresh));
  nn::LayerNormMLP<float> reference(16, {.intermediate_dim = 24, .fp8 = fp8::CurrentScaling{}}, seed);
  reference.load_state_dict(mlp.state_dict());
  CHECK(test::bitwise_equal(fresh, reference(x).value()));

  mlp.load_state_dict(twin.state_dict());  // back to the twin's values: the copies are made again
  CHECK(test::bitwise_equal(mlp(x).value(), twin(x).value()));

  nn::Dense<float> dense(16, {.features = 8, .fp8 = fp8::CurrentScaling{}, .fp8_weight_cache = true}, seed);
  dense(x);
  dense(x);
  CHECK(nn::summary(dense, x.value()).find("fp8 weight copies made: 1") != std::string::npos);
}

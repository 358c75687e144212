// FP8 recipes' arithmetic against hand-computed cases: the scales of delayed, current and block scaling (margin,
// zero amax, tiny amax), delayed scaling's history (roll-over, max against most_recent, steps, a step without
// amaxes, a restored -0), a non-finite amax refused with the step dropped, the formats each role takes, and block
// scaling's tiles of a gated tensor.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "tapegrad/ops/fp8/detail/quantize.hpp"
#include "tapegrad/ops/fp8/weight_cache.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using namespace tapegrad::fp8;

TEST_CASE("scales map the amax onto the format's largest value") {
  CHECK(max_value<Format::e4m3>() == 448.0f);
  CHECK(max_value<Format::e5m2>() == 57344.0f);
  CHECK(delayed_scale(2.0f, 1.0f, 448.0f, 0.0f) == 224.0f);
  CHECK(delayed_scale(2.0f, 1.0f, 448.0f, 1.0f) == 112.0f);   // margin 1: half of it
  CHECK(delayed_scale_by(2.0f, 1.0f, 448.0f, margin_factor(1.0f)) == 112.0f);  // the factor made once, for a GPU
  CHECK(delayed_scale(0.0f, 5.0f, 448.0f, 0.0f) == 5.0f);     // zero amax: the previous scale
  CHECK(delayed_scale(1e-40f, 1.0f, 448.0f, 0.0f) == std::numeric_limits<float>::max());  // past f32: its largest
  CHECK(current_scale(0.0f, 57344.0f) == 1.0f);
  CHECK(current_scale(7.0f, 448.0f) == 64.0f);
  CHECK(block_scale(7.0f, 448.0f) == 64.0f);   // 448 / 7 = 64 exactly
  CHECK(block_scale(5.0f, 448.0f) == 64.0f);   // 89.6: the power of two below
  CHECK(block_scale(500.0f, 448.0f) == 0.5f);  // 0.896
  CHECK(block_scale(0.0f, 448.0f) == 1.0f);
}

TEST_CASE("block scaling tiles each part of a gated tensor on its own") {
  // [3, 2 · 130]: two parts of 130 columns, each tiled [0, 128) and [128, 130) from its own first column, so the
  // result is each part quantized alone. Tiles over all 260 columns would mix the parts: there the second part's
  // values, 2^30 times the first's, would flush the first part's last two columns to zero.
  const std::int64_t rows = 3, part = 130;
  Tensor<float> x = randn<float>({rows, 2 * part}, 7);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.flat(i) *= i % (2 * part) < part ? 0x1p-20f : 0x1p10f;
  const Tensor<float> parted = detail::block_quantized<float>(x, rows, 2 * part, 1, 128, 2);
  const Tensor<float> whole = detail::block_quantized<float>(x, rows, 2 * part, 1, 128);
  std::int64_t mismatches = 0, differences = 0;
  for (std::int64_t p = 0; p < 2; ++p) {
    Tensor<float> alone(Shape{rows, part});
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < part; ++c) alone.flat(r * part + c) = x.flat(r * 2 * part + p * part + c);
    }
    const Tensor<float> want = detail::block_quantized<float>(alone, rows, part, 1, 128);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < part; ++c) {
        const std::int64_t i = r * 2 * part + p * part + c;
        mismatches += parted.flat(i) != want.flat(r * part + c);
        differences += whole.flat(i) != want.flat(r * part + c);
      }
    }
  }
  CHECK(mismatches == 0);
  CHECK(differences > 0);
}

TEST_CASE("hybrid quantizes gradients to e5m2 and the rest to e4m3") {
  for (Role r : roles) {
    CAPTURE(role_name(r));
    CHECK(format_of(Formats::e4m3, r) == Format::e4m3);
    CHECK(format_of(Formats::hybrid, r) == (is_gradient(r) ? Format::e5m2 : Format::e4m3));
  }
  CHECK(role_name(Role::grad_hidden) == "dz");
}

TEST_CASE("delayed scaling rolls each history and makes the next scales from it") {
  ScalingState state({.margin = 0, .format = Formats::hybrid, .amax_history_len = 3});
  CHECK(state.scale(Role::input) == 1.0f);
  CHECK_FALSE(state.pending());
  // Step 0: h reaches 4, dy 8 (recorded twice, the larger kept), W1 nothing.
  state.record(Role::input, 4.0f);
  state.record(Role::grad_output, 2.0f);
  state.record(Role::grad_output, 8.0f);
  CHECK(state.pending());
  CHECK(state.amax_history(Role::grad_output)[0] == 8.0f);
  state.update();
  CHECK(state.steps() == 1);
  CHECK(state.scale(Role::input) == 112.0f);           // 448 / 4
  CHECK(state.scale(Role::grad_output) == 7168.0f);    // 57344 / 8 (e5m2)
  CHECK(state.scale(Role::kernel1) == 1.0f);           // nothing seen yet: kept
  CHECK(std::vector<float>(state.amax_history(Role::input).begin(), state.amax_history(Role::input).end()) ==
        std::vector<float>{0, 4, 0});
  // Steps 1 and 2: smaller amaxes; the history's max (4) still rules until it rolls out.
  state.record(Role::input, 2.0f);
  state.update();
  CHECK(state.scale(Role::input) == 112.0f);
  state.record(Role::input, 1.0f);
  state.update();
  CHECK(state.scale(Role::input) == 112.0f);
  CHECK(std::vector<float>(state.amax_history(Role::input).begin(), state.amax_history(Role::input).end()) ==
        std::vector<float>{0, 1, 2});
  // Step 3: the 4 has left the history (length 3): max(1, 2, 0.5) = 2.
  state.record(Role::input, 0.5f);
  state.update();
  CHECK(state.scale(Role::input) == 224.0f);
  CHECK(state.steps() == 4);
}

TEST_CASE("most_recent takes the step's own amax; the margin halves per unit") {
  ScalingState state({.margin = 2, .format = Formats::e4m3, .amax_history_len = 16,
                      .amax_compute = AmaxCompute::most_recent});
  state.record(Role::activation, 8.0f);
  state.update();
  CHECK(state.scale(Role::activation) == 14.0f);  // 448 / 8 / 4
  state.record(Role::activation, 1.0f);
  state.update();
  CHECK(state.scale(Role::activation) == 112.0f);  // the 8 is still in the history, but only the newest counts
  state.record(Role::grad_hidden, 16.0f);
  state.update();
  CHECK(state.scale(Role::grad_hidden) == 7.0f);  // e4m3 for gradients too: 448 / 16 / 4
  CHECK(state.scale(Role::activation) == 112.0f);  // a step without an amax for it keeps its scale (amax 0)
}

TEST_CASE("update() with nothing recorded counts a step and rolls a zero in") {
  ScalingState state({.amax_history_len = 2});
  state.record(Role::input, 4.0f);
  state.update();
  state.update();
  CHECK(state.steps() == 2);
  CHECK(state.amax_history(Role::input)[1] == 0.0f);
  CHECK(state.scale(Role::input) == 112.0f);  // max(0, 4): the 4 still in the history
  state.update();
  CHECK(state.steps() == 3);
  CHECK(state.scale(Role::input) == 112.0f);  // all zeros: kept
}

TEST_CASE("restore() takes an amax of -0 as +0") {
  ScalingState state({.amax_history_len = 3});
  ScalingState::Snapshot values = state.snapshot();
  values.histories = std::vector<float>(values.histories.size(), -0.0f);
  values.histories[2] = 4.0f;
  state.restore(values);
  for (float amax : state.snapshot().histories) CHECK_FALSE(std::signbit(amax));
  state.update();
  CHECK(state.scale(Role::input) == 112.0f);
}

TEST_CASE("a tensor of zeros keeps the scale") {
  ScalingState state;
  state.record(Role::kernel2, 0.0f);
  state.update();
  CHECK(state.scale(Role::kernel2) == 1.0f);
  CHECK(state.steps() == 1);
}

TEST_CASE("a NaN or infinite amax is refused naming the role and the step, and drops the step") {
  for (float bad : {INFINITY, NAN}) {
    CAPTURE(bad);
    ScalingState state({.amax_history_len = 4});
    state.record(Role::input, 3.5f);
    state.update();
    state.record(Role::input, 7.0f);
    state.record(Role::grad_output, bad);
    state.record(Role::grad_output, 1.0f);  // a later finite amax does not hide it
    CHECK_THROWS_WITH_AS(state.update(),
                         doctest::Contains("fp8 delayed scaling: the amax of dy at step 1 is"), Error);
    CHECK(state.steps() == 1);
    CHECK_FALSE(state.pending());
    CHECK(state.scale(Role::input) == 128.0f);  // 448 / 3.5, as before the refused step
    CHECK(state.amax_history(Role::input)[0] == 0.0f);
    CHECK(state.amax_history(Role::input)[1] == 3.5f);
    // The state keeps working.
    state.record(Role::input, 7.0f);
    state.update();
    CHECK(state.scale(Role::input) == 64.0f);
    CHECK(state.steps() == 2);
  }
}

TEST_CASE("a recipe out of range is refused naming the field") {
  CHECK_THROWS_WITH_AS(ScalingState({.margin = -1}), doctest::Contains("margin must be finite and >= 0, got -1"),
                       Error);
  CHECK_THROWS_WITH_AS(ScalingState({.margin = NAN}), doctest::Contains("margin must be finite"), Error);
  CHECK_THROWS_WITH_AS(ScalingState({.amax_history_len = 0}), doctest::Contains("amax_history_len must be >= 1"),
                       Error);
  CHECK_THROWS_WITH_AS(ScalingState({.format = Formats(9)}), doctest::Contains("format 9 is not a Formats"), Error);
}

TEST_CASE("the GPU dispatch quantizes where the products' saving outgrows the quantization, by recipe and cache") {
  const Fp8Quantization delayed = fp8_quantization(DelayedScaling{}), current = fp8_quantization(CurrentScaling{}),
                        block = fp8_quantization(BlockScaling{});
  Fp8Quantization delayed_cached = delayed;
  delayed_cached.weight_cache = std::make_shared<WeightCache>();
  const auto mlp = [](std::int64_t M, std::int64_t H, std::int64_t F) { return StepWork::layernorm_mlp(M, H, F, 1); };
  // The fitted shapes' decisions (bench/RESULTS.md's fp8 table): a large block pays in every recipe, the smallest in
  // none; at (4096, 1024, 4096) delayed scaling pays and block scaling does not.
  for (const Fp8Quantization* q : {&delayed, &current, &block}) {
    CHECK(pays_on_gpu(*q, mlp(8192, 4096, 16384)));
    CHECK(pays_on_gpu(*q, StepWork::layernorm_mlp(8192, 4096, 11008, 2)));
    CHECK(!pays_on_gpu(*q, mlp(256, 256, 1024)));
  }
  CHECK(pays_on_gpu(delayed, mlp(4096, 1024, 4096)));
  CHECK(!pays_on_gpu(block, mlp(4096, 1024, 4096)));
  // Few tokens through wide weights: their quantization each step outweighs the saving, a weight cache's copies not.
  CHECK(!pays_on_gpu(delayed, mlp(512, 2048, 8192)));
  CHECK(pays_on_gpu(delayed_cached, mlp(512, 2048, 8192)));
  CHECK(predicted_gpu_saving_us(delayed_cached, mlp(512, 2048, 8192)) -
            predicted_gpu_saving_us(delayed, mlp(512, 2048, 8192)) ==
        doctest::Approx(1.934 * 2 * 2048 * 8192 * 1e-6));
  // The saving grows with the tokens, and each recipe's costs order as its passes: delayed < current < block.
  for (std::int64_t M = 256; M < 65536; M *= 2) {
    CAPTURE(M);
    CHECK(predicted_gpu_saving_us(delayed, mlp(2 * M, 1024, 4096)) > predicted_gpu_saving_us(delayed, mlp(M, 1024, 4096)));
    CHECK(predicted_gpu_saving_us(delayed, mlp(M, 1024, 4096)) > predicted_gpu_saving_us(current, mlp(M, 1024, 4096)));
    CHECK(predicted_gpu_saving_us(current, mlp(M, 1024, 4096)) > predicted_gpu_saving_us(block, mlp(M, 1024, 4096)));
  }
  // fp8_dense counts its three products, x and dy, and its kernel.
  CHECK(pays_on_gpu(delayed, StepWork::dense(8192, 4096, 4096)));
  CHECK(!pays_on_gpu(delayed, StepWork::dense(64, 64, 64)));
  const StepWork dense = StepWork::dense(3, 5, 7);
  CHECK(dense.multiply_adds == 3 * 3 * 5 * 7);
  CHECK(dense.activation_elements == 3 * 5 + 3 * 7);
  CHECK(dense.weight_elements == 5 * 7);
}

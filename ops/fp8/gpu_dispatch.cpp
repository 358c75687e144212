#include "tapegrad/ops/fp8/gpu_dispatch.hpp"

#include <type_traits>
#include <variant>

namespace tapegrad::fp8 {

namespace {

// µs per G multiply-adds saved, and µs per M activation elements, per M weight elements and per tensor spent: the
// fit of bench/fp8_dispatch_fit.py to bench/RESULTS.md's fp8 table (an H100; the activation backward under bf16's
// memory: da in parts, dz's codes packed into z).
struct Costs {
  double saving, activation, weight, launch;
};
constexpr Costs delayed_costs{.saving = 1.398, .activation = 1.847, .weight = 1.934, .launch = 2.94};
constexpr Costs current_costs{.saving = 1.390, .activation = 2.717, .weight = 2.709, .launch = 3.64};
constexpr Costs block_costs{.saving = 1.074, .activation = 3.454, .weight = 3.696, .launch = 6.14};

Costs costs_of(const Recipe& recipe) {
  return std::visit(
      [](const auto& r) {
        using R = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<R, DelayedScaling>) return delayed_costs;
        else if constexpr (std::is_same_v<R, CurrentScaling>) return current_costs;
        else return block_costs;
      },
      recipe);
}

}  // namespace

StepWork StepWork::layernorm_mlp(std::int64_t M, std::int64_t H, std::int64_t F, int width) {
  const double m = static_cast<double>(M), h = static_cast<double>(H), f = static_cast<double>(F);
  return {.multiply_adds = 3 * m * h * f * (1 + width),
          .activation_elements = 2 * m * h + (1 + width) * m * f,
          .weight_elements = h * f * (1 + width),
          .tensors = 6};
}

StepWork StepWork::dense(std::int64_t M, std::int64_t K, std::int64_t N) {
  const double m = static_cast<double>(M), k = static_cast<double>(K), n = static_cast<double>(N);
  return {.multiply_adds = 3 * m * k * n, .activation_elements = m * k + m * n, .weight_elements = k * n, .tensors = 3};
}

double predicted_gpu_saving_us(const Fp8Quantization& q, const StepWork& work) {
  const Costs c = costs_of(q.recipe);
  const double weights = q.weight_cache ? 0.0 : work.weight_elements;
  return c.saving * work.multiply_adds * 1e-9 - c.activation * work.activation_elements * 1e-6 -
         c.weight * weights * 1e-6 - c.launch * work.tensors;
}

bool pays_on_gpu(const Fp8Quantization& q, const StepWork& work) { return predicted_gpu_saving_us(q, work) > 0; }

}  // namespace tapegrad::fp8

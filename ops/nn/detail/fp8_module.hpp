// What a module with an FP8 recipe shares (LayerNormMLP, Dense, LayerNormDense): its quantization made from its
// config, the lines summary() shows of it, its weight cache cleared when the parameters change, and delayed scaling's
// state as the module's buffers (state_dict): "fp8_amax_history" [role_count, amax_history_len] and "fp8_scale"
// [role_count] in f32, "fp8_steps" and "fp8_pending" (a step in progress: 0 or 1) as i64 scalars.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tapegrad/ops/fp8/recipe.hpp"
#include "tapegrad/ops/nn/module.hpp"
#include "tapegrad/tensor/factories.hpp"

namespace tapegrad::nn::detail {

// The module's quantization: the recipe with a fresh state where it needs one, and a weight cache where asked for.
inline std::optional<Fp8Quantization> module_fp8(const std::optional<fp8::Recipe>& recipe, bool weight_cache) {
  if (!recipe) return std::nullopt;
  Fp8Quantization q = fp8_quantization(*recipe);
  if (weight_cache) q.weight_cache = std::make_shared<fp8::WeightCache>();
  return q;
}

inline void clear_fp8_weight_cache(const std::optional<Fp8Quantization>& q) {
  if (q && q->weight_cache) q->weight_cache->clear();
}

// The recipe with its settings and, for delayed scaling, the steps its state has completed; none without fp8.
inline std::vector<std::string> fp8_notes(const std::optional<Fp8Quantization>& q) {
  if (!q) return {};
  std::vector<std::string> notes{fp8::describe(q->recipe)};
  if (q->state) notes.push_back("fp8 steps done: " + std::to_string(q->state->steps()));
  if (q->weight_cache) notes.push_back("fp8 weight copies made: " + std::to_string(q->weight_cache->copies_made()));
  return notes;
}

// Delayed scaling's state as buffers; none for other recipes and without fp8.
inline StateDict fp8_buffers(const std::optional<Fp8Quantization>& q) {
  if (!q || !q->state) return {};
  const fp8::ScalingState::Snapshot s = q->state->snapshot();
  const std::int64_t roles = fp8::role_count, length = q->state->recipe().amax_history_len;
  return {{"fp8_amax_history", from_vector<float>(s.histories, {roles, length})},
          {"fp8_scale", from_vector<float>({s.scales.begin(), s.scales.end()}, {roles})},
          {"fp8_steps", from_vector<std::int64_t>({s.steps}, {})},
          {"fp8_pending", from_vector<std::int64_t>({s.pending ? 1 : 0}, {})}};
}

// Puts back what fp8_buffers gave (Module::load_state_dict has checked the names, dtypes and shapes).
inline void load_fp8_buffers(const std::optional<Fp8Quantization>& q, const StateDict& buffers) {
  const auto values = [&](const char* name, auto tag) {
    return buffers.at(name).get<decltype(tag)>().to(Device::cpu()).to_vector();
  };
  fp8::ScalingState::Snapshot s{.histories = values("fp8_amax_history", float{}),
                                .steps = values("fp8_steps", std::int64_t{}).at(0),
                                .pending = values("fp8_pending", std::int64_t{}).at(0) != 0};
  const std::vector<float> scales = values("fp8_scale", float{});
  std::copy(scales.begin(), scales.end(), s.scales.begin());
  q->state->restore(s);
}

}  // namespace tapegrad::nn::detail

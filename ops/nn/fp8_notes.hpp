// What a module's summary shows of its FP8 quantization (LayerNormMLP, Dense, LayerNormDense with a recipe).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tapegrad/ops/fp8.hpp"

namespace tapegrad::nn::detail {

// The recipe with its settings and, for delayed scaling, the steps its state has completed; none without fp8.
inline std::vector<std::string> fp8_notes(const std::optional<Fp8Quantization>& q) {
  if (!q) return {};
  std::vector<std::string> notes{fp8::describe(q->recipe)};
  if (q->state) notes.push_back("fp8 steps done: " + std::to_string(q->state->steps()));
  return notes;
}

}  // namespace tapegrad::nn::detail

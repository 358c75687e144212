// FP8 quantization of layernorm_mlp's GEMM inputs: TransformerEngine's recipes (transformer_engine.common.recipe),
// the roles of the tensors they quantize, and delayed scaling's state.
//
// A quantized tensor x is stored as fp8(x · scale) (tensor/core/fp8.hpp: round to nearest even, saturating) and
// read back as fp8 · (1 / scale); every GEMM multiplies such values and accumulates in f32.
//   DelayedScaling: each role keeps a history of its amax (max |x|) over the last steps; a step quantizes with the
//     scale made from the history before it, max / amax / 2^margin (amax the history's max, or its newest entry with
//     most_recent), and records its own amax, which enters the history when the step ends (ScalingState::update).
//   CurrentScaling: each tensor's scale comes from its own amax, in the same step.
//   BlockScaling (DeepSeek-V3's): e4m3 everywhere; a scale per 1×128 tile of activations and gradients along the
//     GEMM's inner dimension and per 128×128 block of the weights, each the largest power of two not above
//     max / amax of its tile.
// Formats: hybrid quantizes the forward's inputs (h, W1, a, W2) to e4m3 and the gradients (dy, dz) to e5m2; e4m3
// quantizes all of them to e4m3.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "tapegrad/ops/fp8/roles.hpp"
#include "tapegrad/ops/fp8/weight_cache.hpp"
#include "tapegrad/tensor/core/fp8.hpp"

namespace tapegrad::fp8 {

enum class Formats : std::uint8_t { hybrid, e4m3 };
enum class AmaxCompute : std::uint8_t { max, most_recent };

struct DelayedScaling {
  double margin = 0;  // scales aim at 2^-margin × the format's largest value; finite and >= 0
  Formats format = Formats::hybrid;
  int amax_history_len = 1024;  // >= 1
  AmaxCompute amax_compute = AmaxCompute::max;
  friend bool operator==(const DelayedScaling&, const DelayedScaling&) = default;
};
struct CurrentScaling {
  Formats format = Formats::hybrid;
};
struct BlockScaling {};

using Recipe = std::variant<DelayedScaling, CurrentScaling, BlockScaling>;

// The recipe with its settings, as a module's summary shows it: "fp8 delayed scaling (hybrid, margin 0, history
// 1024, max)", "fp8 current scaling (e4m3)", "fp8 block scaling (1x128, 128x128)".
std::string describe(const Recipe& recipe);

// The format `formats` gives a role.
Format format_of(Formats formats, Role role);
// The formats a recipe quantizes to (block scaling: e4m3 everywhere).
Formats formats_of(const Recipe& recipe);

// Delayed scaling's state for one node (a module owns one; a caller of layernorm_mlp passes its own): per role, the
// amax history and the scale the next quantization uses, and the count of completed steps. Every value is
// computed in a fixed order (a maximum is order-free), so the same steps give the same bits. Scales start at 1.
class ScalingState {
 public:
  // Throws naming the field when the recipe's margin or history length is out of range.
  explicit ScalingState(const DelayedScaling& recipe = {});

  const DelayedScaling& recipe() const { return recipe_; }
  std::int64_t steps() const { return steps_; }
  float scale(Role role) const { return scales_[index(role)]; }
  // Role's amax history, newest first: entry 0 is the step in progress (0 until something is recorded).
  std::span<const float> amax_history(Role role) const;
  // Whether the step in progress has recorded anything.
  bool pending() const { return pending_ || !deferred_.empty(); }

  // Records one quantized tensor's amax for the step in progress (the maximum with what the step has recorded).
  void record(Role role, float amax);
  // Records an amax that `read` returns when the step ends or a history is read: a GPU step's amaxes stay on the
  // device until then, so that the step itself never waits for the device.
  void record_later(Role role, std::function<float()> read);
  // Ends the step: each role's scale is made from its history (the step's amax included), then the history rolls
  // by one and the new entry 0 is zero; steps() counts it. A step with a NaN or infinite amax is refused: it throws
  // naming the role and the step, and the step's amaxes are dropped (histories and scales stay as they were).
  void update();

  // The whole state, for checkpoints: every role's history as amax_history gives it (a step in progress's amaxes in
  // entry 0), the scales, the steps done and whether a step is in progress. restore() puts a snapshot back into a
  // state of the same history length (the next update() then does what it would have done); it throws naming the
  // field that does not fit, and changes nothing then.
  struct Snapshot {
    std::vector<float> histories;  // [role_count · amax_history_len], role by role
    std::array<float, role_count> scales{};
    std::int64_t steps = 0;
    bool pending = false;
  };
  Snapshot snapshot() const;
  void restore(const Snapshot& snapshot);

 private:
  static std::size_t index(Role role) { return static_cast<std::size_t>(role); }
  float& history(Role role, int slot) const;
  void merge(Role role, float amax) const;
  void settle() const;  // records what record_later deferred

  DelayedScaling recipe_;
  // [role_count, amax_history_len]; with what follows, mutable so that reading a history can settle it first
  mutable std::vector<float> histories_;
  mutable std::vector<std::pair<Role, std::function<float()>>> deferred_;
  std::array<float, role_count> scales_{};
  std::int64_t steps_ = 0;
  mutable bool pending_ = false;
};

}  // namespace tapegrad::fp8

namespace tapegrad {

// FP8 quantization of an op's GEMM inputs (layernorm_mlp's options.fp8, fp8_dense): the recipe, and its state where
// it keeps one.
struct Fp8Quantization {
  fp8::Recipe recipe = fp8::DelayedScaling{};
  // Delayed scaling's state, made with the same recipe; required with it, unused by the others. A forward that
  // finds amaxes recorded since the state's last update ends that step first (ScalingState::update).
  std::shared_ptr<fp8::ScalingState> state{};
  // On a GPU, the forward's products let the tensor cores keep fewer bits between partial sums (faster;
  // TransformerEngine's choice for them); false sums them as the backward's, in full f32. No effect on the CPU.
  bool fast_forward_accumulation = true;
  // Micro-batches: the weights' fp8 copies kept from forward to forward (ops/fp8/weight_cache.hpp); none: every
  // forward quantizes its weights.
  std::shared_ptr<fp8::WeightCache> weight_cache{};
};

// The recipe with a fresh state where it needs one (delayed scaling).
inline Fp8Quantization fp8_quantization(const fp8::Recipe& recipe) {
  Fp8Quantization q{.recipe = recipe};
  if (const auto* delayed = std::get_if<fp8::DelayedScaling>(&recipe)) {
    q.state = std::make_shared<fp8::ScalingState>(*delayed);
  }
  return q;
}

}  // namespace tapegrad

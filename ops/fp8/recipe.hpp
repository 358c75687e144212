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
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "tapegrad/ops/fp8/roles.hpp"
#include "tapegrad/ops/fp8/weight_cache.hpp"
#include "tapegrad/tensor/core/device.hpp"
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

class StateOnDevice;

// Delayed scaling's state for one node (a module owns one; a caller of layernorm_mlp passes its own): per role, the
// amax history and the scale the next quantization uses, and the count of completed steps. Every value is
// computed in a fixed order (a maximum is order-free), so the same steps give the same bits. Scales start at 1.
//
// GPU steps keep the state on their device (ops/fp8/detail/state_on_device.hpp): a step reads its scales there,
// merges its amaxes there, and the next step (or update()) ends it there by a kernel, so that no step waits for the
// host and a CUDA graph can capture forward, backward and update. From then on the device holds the state, always
// at the same addresses (a captured graph stays valid): reading it on the host (steps(), scale(), amax_history(),
// pending(), snapshot()) waits for the device and copies the values back, changing it there (record(), restore())
// copies them to the device again. A GPU step on another device moves it there.
class ScalingState {
 public:
  // Throws naming the field when the recipe's margin or history length is out of range.
  explicit ScalingState(const DelayedScaling& recipe = {});
  ScalingState(const ScalingState&) = delete;  // (shared by the ops that use it, as a shared_ptr)
  ScalingState& operator=(const ScalingState&) = delete;
  ~ScalingState();

  const DelayedScaling& recipe() const { return recipe_; }
  std::int64_t steps() const;
  float scale(Role role) const;
  // Role's amax history, newest first: entry 0 is the step in progress (0 until something is recorded). The span
  // lives as long as the state; while the state is on a GPU it shows the values of the last read on the host.
  std::span<const float> amax_history(Role role) const;
  // Whether a step is in progress: something recorded on the host, or a GPU step begun.
  bool pending() const;

  // Records one quantized tensor's amax for the step in progress (the maximum with what the step has recorded).
  void record(Role role, float amax);
  // Ends the step, whether or not anything was recorded: each role's scale is made from its history (the step's
  // amax included), then the history rolls by one and the new entry 0 is zero; steps() counts it. A step with a NaN
  // or infinite amax is refused: the step's amaxes are dropped (histories and scales stay as they were) and an
  // Error names the role and the step. On the host it is thrown here; on a GPU the device refuses the step and the
  // state's next read on the host throws it.
  void update();

  // The whole state, for checkpoints: every role's history as amax_history gives it (a step in progress's amaxes in
  // entry 0), the scales, the steps done and whether a step is in progress. restore() puts a snapshot back into a
  // state of the same history length (the next update() then does what it would have done; an amax of -0 becomes
  // +0); it throws naming the field that does not fit, and changes nothing then. A step the GPU refused and no read
  // has reported yet is still thrown by the next read.
  struct Snapshot {
    std::vector<float> histories;  // [role_count · amax_history_len], role by role
    std::array<float, role_count> scales{};
    std::int64_t steps = 0;
    bool pending = false;
  };
  Snapshot snapshot() const;
  void restore(const Snapshot& snapshot);

  // For GPU steps (ops/fp8/detail/state_on_device.hpp): the state's copy on `device`, made by `make` from the
  // state's values where it has none there yet (from then on the device's values are the state's).
  StateOnDevice& on_device(Device device,
                                   const std::function<std::unique_ptr<StateOnDevice>(const Snapshot&)>& make);

 private:
  static std::size_t index(Role role) { return static_cast<std::size_t>(role); }
  float& history(Role role, int slot) const;
  void download() const;  // the device's values into the host's, waiting for it; a step it refused throws
  void upload();          // the host's values into the device's

  DelayedScaling recipe_;
  // [role_count, amax_history_len]; with what follows, mutable so that a read can copy the device's values
  mutable std::vector<float> histories_;
  mutable std::array<float, role_count> scales_{};
  mutable std::int64_t steps_ = 0;
  mutable bool pending_ = false;
  mutable std::unique_ptr<StateOnDevice> device_;
};

// A refused step as the device found it: the role whose amax was not finite, the step and the amax.
struct RefusedStep {
  Role role = Role::input;
  std::int64_t step = 0;
  float amax = 0;
};

// A ScalingState's values on a GPU, while its steps run there (made by ops/fp8/detail/state_on_device.hpp).
class StateOnDevice {
 public:
  virtual ~StateOnDevice() = default;
  virtual Device device() const = 0;
  // Ends the step on the device, open or not, queued (ScalingState::update on the GPU).
  virtual void end_step() = 0;
  // The values, waiting for the device, and the first step it refused since the last call, if any.
  virtual std::pair<ScalingState::Snapshot, std::optional<RefusedStep>> download() = 0;
  // Replaces the values, in the same device memory; a refused step not yet reported stays to be reported.
  virtual void upload(const ScalingState::Snapshot& values) = 0;
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

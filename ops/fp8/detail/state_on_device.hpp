// Delayed scaling's state on a GPU: ScalingState's StateOnDevice (ops/fp8/recipe.hpp) in the buffers that
// cuda/fp8_delayed_scaling.hpp's kernels read and write, allocated once (a captured graph keeps their addresses).
// Internal to ops/; CUDA builds.
#pragma once

#include <optional>
#include <utility>

#include "tapegrad/cuda/fp8_delayed_scaling.hpp"
#include "tapegrad/ops/fp8/recipe.hpp"
#include "tapegrad/tensor/dist/communicator.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::detail {

class DelayedStateOnDevice final : public fp8::StateOnDevice {
 public:
  // The state's values (as ScalingState::snapshot gives them) copied to `device`.
  DelayedStateOnDevice(const fp8::DelayedScaling& recipe, const fp8::ScalingState::Snapshot& values, Device device);

  Device device() const override { return device_; }
  void end_step() override;
  std::pair<fp8::ScalingState::Snapshot, std::optional<fp8::RefusedStep>> download() override;
  void upload(const fp8::ScalingState::Snapshot& values) override;

  // Starts a step (ending the open one): each role's scale and its inverse into step_scalars [role_count, fields].
  void begin_step(float* step_scalars, int fields, int scale_inv_field, int scale_field);
  // Where the step's quantizations of `role` merge their amax.
  float* amax(fp8::Role role) { return amaxes_.data() + static_cast<std::int64_t>(role); }
  // The step's amaxes so far replaced by their maximum over comm's ranks (a pass's end; every rank calls it).
  void reduce_over(const dist::Communicator& comm);

 private:
  cuda::DelayedScalingState buffers();

  fp8::DelayedScaling recipe_;
  Device device_;
  std::int64_t ring_length_;
  Tensor<float> amaxes_, ring_, scales_;  // [role_count], [role_count, ring_length], [role_count]
  Tensor<double> counters_;               // [cuda::counter_count]
};

// state's copy on `device`, made from its values there the first time.
DelayedStateOnDevice& delayed_state_on(fp8::ScalingState& state, Device device);

}  // namespace tapegrad::detail

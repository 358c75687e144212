// Delayed scaling's state on the GPU (ops/fp8/recipe.hpp has its rules; ops/fp8/detail/state_on_device.hpp keeps it):
// the steps' scales come from it and their amaxes go into it on the device, and a kernel ends each step there, so
// that a step never waits for the host and a CUDA graph can capture it whole (forward, backward and update).
// Plain C++ (see tensor/gpu/backend.hpp for how ops call it); the work is queued on the device's current stream.
#pragma once


namespace tapegrad::cuda {

// What the kernels read and write, on the device, for `roles` tensors (at most max_roles):
//   amaxes [roles]            the step in progress's amax per role (quantization kernels merge |x| into it);
//   ring [roles, ring_length] the amaxes of the last ring_length completed steps, completed step s at slot
//                             s % ring_length (ring_length = the history's length − 1: entry 0 is `amaxes`);
//   scales [roles]            the scale each role quantizes the next step with;
//   counters                  doubles (exact to 2^53): the completed steps, whether a step is open, and the first
//                             refused step not yet reported: refused (0 or 1), its role, its step, its amax.
// A refused step (a non-finite amax in any role) leaves the ring and the scales as they were and drops its amaxes.
inline constexpr int max_roles = 8;
enum DelayedCounter : int { steps_done, step_open, refused, refused_role, refused_step, refused_amax, counter_count };
struct DelayedScalingState {
  float* amaxes = nullptr;
  float* ring = nullptr;
  float* scales = nullptr;
  double* counters = nullptr;
  int roles = 0, ring_length = 0;
  bool most_recent = false;          // the scale from the newest amax alone, not the history's maximum
  float margin_factor = 1;           // 2^margin, made on the host (tensor/core/fp8.hpp's margin_factor)
  float max_values[max_roles] = {};  // per role, its format's largest value
};

// Starts a step: ends the open one first, if one is (as a forward ends a pending step on the host), then writes
// each role's scale and its inverse into step_scalars (role r's at r · fields + scale_field and + scale_inv_field)
// and opens the new step.
void fp8_delayed_begin_step(const DelayedScalingState& state, float* step_scalars, int fields, int scale_inv_field,
                            int scale_field, int device);
// Ends the step, open or not, as ScalingState::update does on the host: each role's scale from its history (this
// step's amax included) by tensor/core/fp8.hpp's delayed_scale_by, the amax into the ring, the step counted; or the
// step refused, as above.
void fp8_delayed_end_step(const DelayedScalingState& state, int device);
// out[i] = the maximum of gathered[r · n + i] over r < ranks (a NaN wins): amaxes gathered from a group's ranks.
void fp8_max_over_ranks(const float* gathered, int ranks, int n, float* out, int device);

}  // namespace tapegrad::cuda

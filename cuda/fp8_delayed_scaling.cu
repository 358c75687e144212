// Delayed scaling's step on the device (fp8_delayed_scaling.hpp): one block ends a step, a warp per role, each role's
// history maximum reduced by its warp over the f32 bits of the amaxes (non-negative, and a zero +0: restore() makes
// a -0 +0, so they order as the values do): the same scales, bit for bit, as the host's ScalingState::update.
#include "tapegrad/cuda/fp8_delayed_scaling.hpp"

#include <cmath>
#include <cstdint>

#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/core/fp8.hpp"
#include "tapegrad/tensor/gpu/detail/check.cuh"
#include "tapegrad/tensor/gpu/detail/launch.cuh"

namespace tapegrad::cuda {

namespace {

constexpr int update_threads = 256;

// Ends the step (ScalingState::update), or, with only_if_open, the open step if there is one; called by every thread
// of the one block, whose warp r takes role r (the roles' histories read side by side). Every load is issued first,
// together (the amaxes, the scales, the counters, each warp's share of its role's history): a step's end costs about
// one round trip to memory, not one per dependent read. Leaves each role's scale for the next step in scales_now
// (shared): the new one, or the old where no step ended or the step was refused.
__device__ void end_step(const DelayedScalingState& s, bool only_if_open, float* scales_now) {
  static_assert(update_threads / 32 >= max_roles);
  __shared__ float newest[max_roles];
  __shared__ int refused_at;
  __shared__ bool end;
  const int r = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  if (threadIdx.x < s.roles) {
    newest[threadIdx.x] = s.amaxes[threadIdx.x];
    scales_now[threadIdx.x] = s.scales[threadIdx.x];
  }
  if (threadIdx.x == 0) end = !only_if_open || s.counters[step_open] != 0;
  const auto done = static_cast<long long>(s.counters[steps_done]);
  // The history's maximum over the f32 bits (see above): this lane's entries, the step's own amax added below.
  unsigned int m = 0;
  if (r < s.roles && !s.most_recent) {
    const float* ring = s.ring + static_cast<std::int64_t>(r) * s.ring_length;
    constexpr int batch = 32;  // loads in flight per lane: a history of 1024 in one round trip
    for (int first = lane; first < s.ring_length; first += 32 * batch) {
      float v[batch];
#pragma unroll
      for (int k = 0; k < batch; ++k) v[k] = ring[min(first + 32 * k, s.ring_length - 1)];  // (repeats change no max)
#pragma unroll
      for (int k = 0; k < batch; ++k) m = max(m, __float_as_uint(v[k]));
    }
  }
  __syncthreads();
  if (!end) return;
  if (threadIdx.x == 0) {
    refused_at = -1;
    for (int role = 0; role < s.roles && refused_at < 0; ++role) {
      if (!isfinite(newest[role])) refused_at = role;
    }
  }
  __syncthreads();
  if (refused_at >= 0) {
    if (threadIdx.x == 0) {
      if (s.counters[refused] == 0) {  // the first one the host has not yet been told of
        s.counters[refused] = 1;
        s.counters[refused_role] = refused_at;
        s.counters[refused_step] = s.counters[steps_done];
        s.counters[refused_amax] = newest[refused_at];
      }
      for (int role = 0; role < s.roles; ++role) s.amaxes[role] = 0.0f;
      s.counters[step_open] = 0;
    }
    return;
  }
  const int slot = s.ring_length > 0 ? static_cast<int>(done % s.ring_length) : 0;
  if (r < s.roles) {
    if (lane == 0) m = max(m, __float_as_uint(newest[r]));
    m = __reduce_max_sync(0xffffffffu, m);
    if (lane == 0) {
      const float scale =
          fp8::delayed_scale_by(__uint_as_float(m), scales_now[r], s.max_values[r], s.margin_factor);
      s.scales[r] = scale;
      scales_now[r] = scale;
      if (s.ring_length > 0) s.ring[static_cast<std::int64_t>(r) * s.ring_length + slot] = newest[r];
      s.amaxes[r] = 0.0f;
    }
  }
  __syncthreads();  // every warp has read steps_done (its slot) before it moves on
  if (threadIdx.x == 0) {
    s.counters[steps_done] = static_cast<double>(done + 1);
    s.counters[step_open] = 0;
  }
}

__global__ void __launch_bounds__(update_threads)
    begin_step_kernel(DelayedScalingState s, float* step_scalars, int fields, int scale_inv_field, int scale_field) {
  __shared__ float scales_now[max_roles];
  end_step(s, true, scales_now);
  __syncthreads();
  if (threadIdx.x < s.roles) {
    const float scale = scales_now[threadIdx.x];
    step_scalars[threadIdx.x * fields + scale_inv_field] = 1.0f / scale;
    step_scalars[threadIdx.x * fields + scale_field] = scale;
  }
  if (threadIdx.x == 0) s.counters[step_open] = 1;
}

// (whether or not a step is open: the host's update() counts a step without amaxes too)
__global__ void __launch_bounds__(update_threads) end_step_kernel(DelayedScalingState s) {
  __shared__ float scales_now[max_roles];
  end_step(s, false, scales_now);
}

__global__ void max_over_ranks_kernel(const float* gathered, int ranks, int n, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned int m = 0;
  for (int r = 0; r < ranks; ++r) m = max(m, __float_as_uint(fabsf(gathered[r * n + i])));  // (NaN's bits win)
  out[i] = __uint_as_float(m);
}

void check_state(const DelayedScalingState& s, const char* op) {
  check(s.roles > 0 && s.roles <= max_roles, op, s.roles, " roles; 1 to ", max_roles, " are kept on the device");
  check(s.ring_length >= 0, op, "a negative history length ", s.ring_length);
  check(s.amaxes && s.scales && s.counters && (s.ring || s.ring_length == 0), op, "a state buffer is null");
}

}  // namespace

void fp8_delayed_begin_step(const DelayedScalingState& state, float* step_scalars, int fields, int scale_inv_field,
                            int scale_field, int device) {
  check_state(state, "fp8_delayed_begin_step");
  const Launch launch(device);
  begin_step_kernel<<<1, update_threads, 0, launch.stream()>>>(state, step_scalars, fields, scale_inv_field,
                                                               scale_field);
  TAPEGRAD_CUDA_CHECK_LAUNCH();
}

void fp8_delayed_end_step(const DelayedScalingState& state, int device) {
  check_state(state, "fp8_delayed_end_step");
  const Launch launch(device);
  end_step_kernel<<<1, update_threads, 0, launch.stream()>>>(state);
  TAPEGRAD_CUDA_CHECK_LAUNCH();
}

void fp8_max_over_ranks(const float* gathered, int ranks, int n, float* out, int device) {
  check(ranks > 0 && n >= 0, "fp8_max_over_ranks", ranks, " ranks of ", n, " amaxes");
  if (n == 0) return;
  const Launch launch(device);
  constexpr int threads = 128;
  max_over_ranks_kernel<<<(n + threads - 1) / threads, threads, 0, launch.stream()>>>(gathered, ranks, n, out);
  TAPEGRAD_CUDA_CHECK_LAUNCH();
}

}  // namespace tapegrad::cuda

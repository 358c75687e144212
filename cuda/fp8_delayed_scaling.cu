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

// Ends the step (ScalingState::update); called by every thread of the one block, whose warp r takes role r (the
// roles' chains of loads run side by side: a step's end costs one history's reads, not one per role).
__device__ void end_step(const DelayedScalingState& s) {
  static_assert(update_threads / 32 >= max_roles);
  __shared__ float newest[max_roles];
  __shared__ int refused_at;
  if (threadIdx.x < s.roles) newest[threadIdx.x] = s.amaxes[threadIdx.x];
  __syncthreads();
  if (threadIdx.x == 0) {
    refused_at = -1;
    for (int r = 0; r < s.roles && refused_at < 0; ++r) {
      if (!isfinite(newest[r])) refused_at = r;
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
      for (int r = 0; r < s.roles; ++r) s.amaxes[r] = 0.0f;
      s.counters[step_open] = 0;
    }
    return;
  }
  const auto done = static_cast<long long>(s.counters[steps_done]);
  const int slot = s.ring_length > 0 ? static_cast<int>(done % s.ring_length) : 0;
  const int r = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  if (r < s.roles) {
    // The history's maximum over the f32 bits (see above), this lane's entries, then the warp's.
    unsigned int m = lane == 0 ? __float_as_uint(newest[r]) : 0u;
    if (!s.most_recent) {
      const float* ring = s.ring + static_cast<std::int64_t>(r) * s.ring_length;
#pragma unroll 8
      for (int i = lane; i < s.ring_length; i += 32) m = max(m, __float_as_uint(ring[i]));
    }
    m = __reduce_max_sync(0xffffffffu, m);
    if (lane == 0) {
      s.scales[r] = fp8::delayed_scale_by(__uint_as_float(m), s.scales[r], s.max_values[r], s.margin_factor);
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
  __shared__ bool open;
  if (threadIdx.x == 0) open = s.counters[step_open] != 0;
  __syncthreads();
  if (open) end_step(s);
  __syncthreads();
  if (threadIdx.x < s.roles) {
    const float scale = s.scales[threadIdx.x];
    step_scalars[threadIdx.x * fields + scale_inv_field] = 1.0f / scale;
    step_scalars[threadIdx.x * fields + scale_field] = scale;
  }
  if (threadIdx.x == 0) s.counters[step_open] = 1;
}

// (whether or not a step is open: the host's update() counts a step without amaxes too)
__global__ void __launch_bounds__(update_threads) end_step_kernel(DelayedScalingState s) { end_step(s); }

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

#include "tapegrad/ops/fp8/detail/state_on_device.hpp"

#include <memory>

#include "tapegrad/tensor/core/detail/op_scope.hpp"
#include "tapegrad/tensor/factories.hpp"
#include "tapegrad/tensor/gpu/graph.hpp"
#include "tapegrad/tensor/storage.hpp"

namespace tapegrad::detail {

namespace {
// The host tensor's values into the first elements of the device tensor, in place.
template <class T> void copy_into(Tensor<T>& device, const Tensor<T>& host) {
  const auto bytes = static_cast<std::size_t>(host.numel()) * sizeof(T);
  copy_bytes(device.data(), device.device(), host.data(), Device::cpu(), bytes);
}

// Where role r's history entry k ≥ 1 (completed step steps − k, below 0 for the zeros a new state's history starts
// with) lies in the ring [role_count, length].
std::int64_t ring_index(std::int64_t r, std::int64_t k, std::int64_t steps, std::int64_t length) {
  return r * length + ((steps - k) % length + length) % length;
}
}  // namespace

DelayedStateOnDevice::DelayedStateOnDevice(const fp8::DelayedScaling& recipe, const fp8::ScalingState::Snapshot& values,
                                           Device device)
    : recipe_(recipe),
      device_(device),
      ring_length_(recipe.amax_history_len - 1),
      amaxes_(Shape{fp8::role_count}, device),
      ring_(Shape{fp8::role_count, ring_length_}, device),
      scales_(Shape{fp8::role_count}, device),
      counters_(zeros<double>({cuda::counter_count}).to(device)) {
  upload(values);
}

void DelayedStateOnDevice::upload(const fp8::ScalingState::Snapshot& values) {
  const std::int64_t length = recipe_.amax_history_len;
  Tensor<float> amaxes = zeros<float>({fp8::role_count}), ring = zeros<float>({fp8::role_count, ring_length_}),
                scales = zeros<float>({fp8::role_count});
  // (the steps and whether one is open; the refusal's counters are kept, so that a refused step not yet reported
  // is still thrown by the state's next read)
  static_assert(cuda::steps_done == 0 && cuda::step_open == 1);
  Tensor<double> counters = zeros<double>({2});
  for (std::int64_t r = 0; r < fp8::role_count; ++r) {
    const float* history = values.histories.data() + r * length;  // newest first
    amaxes.flat(r) = history[0];
    for (std::int64_t k = 1; k < length; ++k) ring.flat(ring_index(r, k, values.steps, ring_length_)) = history[k];
    scales.flat(r) = values.scales[static_cast<std::size_t>(r)];
  }
  counters.flat(cuda::steps_done) = static_cast<double>(values.steps);
  counters.flat(cuda::step_open) = values.pending ? 1.0 : 0.0;
  copy_into(amaxes_, amaxes);
  copy_into(ring_, ring);
  copy_into(scales_, scales);
  copy_into(counters_, counters);
}

cuda::DelayedScalingState DelayedStateOnDevice::buffers() {
  cuda::DelayedScalingState s{.amaxes = amaxes_.data(),
                              .ring = ring_length_ > 0 ? ring_.data() : nullptr,
                              .scales = scales_.data(),
                              .counters = counters_.data(),
                              .roles = fp8::role_count,
                              .ring_length = static_cast<int>(ring_length_),
                              .most_recent = recipe_.amax_compute == fp8::AmaxCompute::most_recent,
                              .margin_factor = fp8::margin_factor(static_cast<float>(recipe_.margin))};
  for (fp8::Role role : fp8::roles) {
    s.max_values[static_cast<int>(role)] = fp8::max_value(fp8::format_of(recipe_.format, role));
  }
  return s;
}

void DelayedStateOnDevice::begin_step(float* step_scalars, int fields, int scale_inv_field, int scale_field) {
  cuda::fp8_delayed_begin_step(buffers(), step_scalars, fields, scale_inv_field, scale_field, device_.index);
}

void DelayedStateOnDevice::end_step() { cuda::fp8_delayed_end_step(buffers(), device_.index); }

void DelayedStateOnDevice::reduce_over(const dist::Communicator& comm) {
  const Tensor<float> gathered = comm.all_gather(amaxes_);
  cuda::fp8_max_over_ranks(gathered.data(), static_cast<int>(comm.size()), fp8::role_count, amaxes_.data(),
                           device_.index);
}

std::pair<fp8::ScalingState::Snapshot, std::optional<fp8::RefusedStep>> DelayedStateOnDevice::download() {
  const Tensor<float> amaxes = amaxes_.to(Device::cpu()), ring = ring_.to(Device::cpu()),
                      scales = scales_.to(Device::cpu());
  const Tensor<double> counters = counters_.to(Device::cpu());
  const std::int64_t length = recipe_.amax_history_len;
  const auto steps = static_cast<std::int64_t>(counters.flat(cuda::steps_done));
  fp8::ScalingState::Snapshot values{
      .histories = std::vector<float>(static_cast<std::size_t>(fp8::role_count * length)),
      .steps = steps,
      .pending = counters.flat(cuda::step_open) != 0};
  for (std::int64_t r = 0; r < fp8::role_count; ++r) {
    float* history = values.histories.data() + r * length;
    history[0] = amaxes.flat(r);
    for (std::int64_t k = 1; k < length; ++k) history[k] = ring.flat(ring_index(r, k, steps, ring_length_));
    values.scales[static_cast<std::size_t>(r)] = scales.flat(r);
  }
  std::optional<fp8::RefusedStep> refused;
  if (counters.flat(cuda::refused) != 0) {  // reported once: the flag goes back to 0
    refused = fp8::RefusedStep{.role = static_cast<fp8::Role>(counters.flat(cuda::refused_role)),
                               .step = static_cast<std::int64_t>(counters.flat(cuda::refused_step)),
                               .amax = static_cast<float>(counters.flat(cuda::refused_amax))};
    const double zero = 0;
    copy_bytes(counters_.data() + cuda::refused, device_, &zero, Device::cpu(), sizeof zero);
  }
  return {std::move(values), refused};
}

DelayedStateOnDevice& delayed_state_on(fp8::ScalingState& state, Device device) {
  return static_cast<DelayedStateOnDevice&>(state.on_device(device, [&](const fp8::ScalingState::Snapshot& values) {
    // Copying the values there waits for the device, which a stream being captured cannot do.
    check(!cuda::capturing(device.index), current_op("fp8 delayed scaling"),
          "fp8 delayed scaling's state goes to ", device, " with its first step there, which waits for the device "
          "and so cannot be captured into a CUDA graph: run one step uncaptured first");
    return std::make_unique<DelayedStateOnDevice>(state.recipe(), values, device);
  }));
}

}  // namespace tapegrad::detail

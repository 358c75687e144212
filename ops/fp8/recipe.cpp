#include "tapegrad/ops/fp8/recipe.hpp"

#include <algorithm>
#include <cmath>

#include "tapegrad/ops/fp8/detail/check.hpp"
#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::fp8 {

namespace {
std::string_view formats_name(Formats formats) { return formats == Formats::hybrid ? "hybrid" : "e4m3"; }

void check_formats(std::string_view op, Formats formats) {
  check(formats == Formats::hybrid || formats == Formats::e4m3, op, "fp8 format ", static_cast<int>(formats),
        " is not a Formats (hybrid or e4m3)");
}
}  // namespace

std::string describe(const Recipe& recipe) {
  if (const auto* delayed = std::get_if<DelayedScaling>(&recipe)) {
    return detail::concat("fp8 delayed scaling (", formats_name(delayed->format), ", margin ", delayed->margin,
                          ", history ", delayed->amax_history_len, ", ",
                          delayed->amax_compute == AmaxCompute::max ? "max" : "most_recent", ")");
  }
  if (const auto* current = std::get_if<CurrentScaling>(&recipe)) {
    return detail::concat("fp8 current scaling (", formats_name(current->format), ")");
  }
  return "fp8 block scaling (1x128, 128x128)";
}

std::string_view role_name(Role role) {
  switch (role) {
    case Role::input: return "h";
    case Role::kernel1: return "w1";
    case Role::activation: return "a";
    case Role::kernel2: return "w2";
    case Role::grad_output: return "dy";
    case Role::grad_hidden: return "dz";
  }
  return "?";
}

bool is_gradient(Role role) { return role == Role::grad_output || role == Role::grad_hidden; }

bool is_weight(Role role) { return role == Role::kernel1 || role == Role::kernel2; }

Format format_of(Formats formats, Role role) {
  return formats == Formats::hybrid && is_gradient(role) ? Format::e5m2 : Format::e4m3;
}

Formats formats_of(const Recipe& recipe) {
  if (const auto* delayed = std::get_if<DelayedScaling>(&recipe)) return delayed->format;
  if (const auto* current = std::get_if<CurrentScaling>(&recipe)) return current->format;
  return Formats::e4m3;
}

ScalingState::ScalingState(const DelayedScaling& recipe) : recipe_(recipe) {
  check(std::isfinite(recipe.margin) && recipe.margin >= 0, "DelayedScaling", "margin must be finite and >= 0, got ",
        recipe.margin);
  check(recipe.amax_history_len >= 1, "DelayedScaling", "amax_history_len must be >= 1, got ",
        recipe.amax_history_len);
  check(recipe.format == Formats::hybrid || recipe.format == Formats::e4m3, "DelayedScaling", "format ",
        static_cast<int>(recipe.format), " is not a Formats (hybrid or e4m3)");
  check(recipe.amax_compute == AmaxCompute::max || recipe.amax_compute == AmaxCompute::most_recent, "DelayedScaling",
        "amax_compute ", static_cast<int>(recipe.amax_compute), " is not an AmaxCompute (max or most_recent)");
  histories_.assign(static_cast<std::size_t>(role_count) * static_cast<std::size_t>(recipe.amax_history_len), 0.0f);
  scales_.fill(1.0f);
}

ScalingState::~ScalingState() = default;

float& ScalingState::history(Role role, int slot) const {
  return histories_[index(role) * static_cast<std::size_t>(recipe_.amax_history_len) + static_cast<std::size_t>(slot)];
}

namespace {
Error refusal(Role role, std::int64_t step, float amax) {
  return Error(detail::concat("layernorm_mlp: fp8 delayed scaling: the amax of ", role_name(role), " at step ", step,
                              " is ", amax,
                              ": the tensor held an infinity or a NaN; the step's amaxes were dropped and the scales "
                              "kept"));
}
}  // namespace

void ScalingState::download() const {
  if (!device_) return;
  auto [values, refused] = device_->download();
  std::ranges::copy(values.histories, histories_.begin());  // in place: amax_history's spans stay valid
  scales_ = values.scales;
  steps_ = values.steps;
  pending_ = values.pending;
  if (refused) throw refusal(refused->role, refused->step, refused->amax);
}

void ScalingState::upload() {
  if (device_) device_->upload({.histories = histories_, .scales = scales_, .steps = steps_, .pending = pending_});
}

StateOnDevice& ScalingState::on_device(
    Device device, const std::function<std::unique_ptr<StateOnDevice>(const Snapshot&)>& make) {
  if (device_ && device_->device() != device) {
    download();
    device_.reset();
  }
  if (!device_) device_ = make(snapshot());
  return *device_;
}

std::int64_t ScalingState::steps() const {
  download();
  return steps_;
}

float ScalingState::scale(Role role) const {
  download();
  return scales_[index(role)];
}

bool ScalingState::pending() const {
  download();
  return pending_;
}

std::span<const float> ScalingState::amax_history(Role role) const {
  download();
  const auto length = static_cast<std::size_t>(recipe_.amax_history_len);
  return std::span<const float>(histories_).subspan(index(role) * length, length);
}

void ScalingState::record(Role role, float amax) {
  download();
  float& newest = history(role, 0);
  // NaN wins the maximum, so that update() sees it.
  newest = std::isnan(amax) || std::isnan(newest) ? NAN : std::max(newest, amax);
  pending_ = true;
  upload();
}

ScalingState::Snapshot ScalingState::snapshot() const {
  download();
  return {.histories = histories_, .scales = scales_, .steps = steps_, .pending = pending_};
}

void ScalingState::restore(const Snapshot& snapshot) {
  constexpr const char* op = "fp8::ScalingState::restore";
  check(snapshot.histories.size() == histories_.size(), op, "the histories hold ", snapshot.histories.size(),
        " amaxes, the state's ", histories_.size(), " (", role_count, " roles of ", recipe_.amax_history_len, ")");
  for (std::size_t i = 0; i < snapshot.histories.size(); ++i) {
    // (entry 0, the step in progress, may hold the infinity or NaN its update() will refuse; completed steps never do)
    const float amax = snapshot.histories[i];
    const bool in_progress = i % static_cast<std::size_t>(recipe_.amax_history_len) == 0;
    check(!(amax < 0.0f) && (in_progress || std::isfinite(amax)), op, "an amax history holds ", amax,
          in_progress ? ", below 0" : " for a completed step");
  }
  for (float scale : snapshot.scales) check(std::isfinite(scale) && scale > 0.0f, op, "a scale is ", scale);
  check(snapshot.steps >= 0, op, "steps must be >= 0, got ", snapshot.steps);
  // A -0 as +0: the device orders amaxes by their bits, where -0 would pass every positive amax.
  std::ranges::transform(snapshot.histories, histories_.begin(),
                         [](float amax) { return amax == 0.0f ? 0.0f : amax; });
  scales_ = snapshot.scales;
  steps_ = snapshot.steps;
  pending_ = snapshot.pending;
  upload();
}

void ScalingState::update() {
  if (device_) {
    device_->end_step();
    return;
  }
  const int length = recipe_.amax_history_len;
  const float factor = margin_factor(static_cast<float>(recipe_.margin));  // (the device's too)
  for (Role role : roles) {
    const float newest = history(role, 0);
    if (!std::isfinite(newest)) {
      for (Role r : roles) history(r, 0) = 0.0f;
      pending_ = false;
      throw refusal(role, steps_, newest);
    }
  }
  for (Role role : roles) {
    const std::span<const float> h = amax_history(role);
    const float amax = recipe_.amax_compute == AmaxCompute::max ? *std::max_element(h.begin(), h.end()) : h[0];
    float& scale = scales_[index(role)];
    scale = delayed_scale_by(amax, scale, max_value(format_of(recipe_.format, role)), factor);
    for (int slot = length - 1; slot > 0; --slot) history(role, slot) = history(role, slot - 1);
    history(role, 0) = 0.0f;
  }
  ++steps_;
  pending_ = false;
}

}  // namespace tapegrad::fp8

namespace tapegrad::detail {

void check_fp8_quantization(std::string_view op, const Fp8Quantization& q) {
  if (const auto* delayed = std::get_if<fp8::DelayedScaling>(&q.recipe)) {
    check(q.state != nullptr, op, "fp8 delayed scaling needs its state: set fp8.state to a ScalingState made with "
          "the same recipe");
    check(q.state->recipe() == *delayed, op, "fp8.state was made with another DelayedScaling than fp8.recipe (margin ",
          q.state->recipe().margin, " against ", delayed->margin, ", amax_history_len ",
          q.state->recipe().amax_history_len, " against ", delayed->amax_history_len, ")");
  } else if (const auto* current = std::get_if<fp8::CurrentScaling>(&q.recipe)) {
    fp8::check_formats(op, current->format);
  }
}

void check_fp8_on_device(std::string_view op, DType x_dtype, Device device) {
  if (device.is_cpu()) return;
  check(x_dtype == DType::f32 || x_dtype == DType::bf16 || x_dtype == DType::f16, op,
        "fp8 on a GPU computes in f32, bf16 or f16 (cuBLASLt's FP8 products write no f64); x is ",
        dtype_name(x_dtype));
}

}  // namespace tapegrad::detail

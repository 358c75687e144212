#include "tapegrad/tensor/initializers.hpp"

#include <cmath>
#include <string_view>

#include "tapegrad/tensor/factories.hpp"
#include "tapegrad/tensor/detail/generate.hpp"

namespace tapegrad {

namespace {

std::string_view mode_name(FanMode mode) {
  switch (mode) {
    case FanMode::fan_in: return "fan_in";
    case FanMode::fan_out: return "fan_out";
    case FanMode::fan_avg: return "fan_avg";
  }
  return "?";
}

std::string_view distribution_name(Distribution distribution) {
  switch (distribution) {
    case Distribution::normal: return "normal";
    case Distribution::truncated_normal: return "truncated_normal";
    case Distribution::uniform: return "uniform";
  }
  return "?";
}

std::string axes_str(const std::vector<int>& axes) {
  std::string s = "{";
  for (std::size_t k = 0; k < axes.size(); ++k) s += (k ? ", " : "") + std::to_string(axes[k]);
  return s + "}";
}

std::string fan_axes_str(const FanAxes& axes) {
  return detail::concat("in ", axes_str(axes.in), ", out ", axes_str(axes.out), ", batch ", axes_str(axes.batch));
}

// The standard deviation of a standard normal truncated to [-2, 2] (JAX divides by it in variance scaling).
constexpr double truncated_normal_stddev = 0.87962566103423978;

}  // namespace

Fans compute_fans(const Shape& shape, const FanAxes& axes, const std::string& op) {
  std::vector<int> role(static_cast<std::size_t>(shape.rank()), -1);  // 0 in, 1 out, 2 batch, -1 receptive field
  std::int64_t size[3] = {1, 1, 1};
  const std::vector<int>* lists[3] = {&axes.in, &axes.out, &axes.batch};
  const char* list_names[3] = {"in", "out", "batch"};
  for (int r = 0; r < 3; ++r) {
    for (const int axis : *lists[r]) {
      check(-shape.rank() <= axis && axis < shape.rank(), op, list_names[r], " axis ", axis,
            " is out of range for shape ", shape, " (rank ", shape.rank(), ")");
      const auto a = static_cast<std::size_t>(axis < 0 ? axis + shape.rank() : axis);
      check(role[a] == -1, op, "axis ", axis, " of shape ", shape, " appears twice in the fan axes (",
            fan_axes_str(axes), ")");
      role[a] = r;
      size[r] *= shape[static_cast<int>(a)];
    }
  }
  std::int64_t receptive_field = 1;
  for (int a = 0; a < shape.rank(); ++a) receptive_field *= role[static_cast<std::size_t>(a)] == -1 ? shape[a] : 1;
  return {size[0] * receptive_field, size[1] * receptive_field};
}

Initializer Initializer::zeros() { return constant(0.0).named("zeros"); }
Initializer Initializer::ones() { return constant(1.0).named("ones"); }

Initializer Initializer::constant(double value) {
  check(std::isfinite(value), "constant", "value ", value, " is not finite");
  Initializer init(Kind::constant, detail::concat("constant(", value, ")"));
  init.mean_ = value;
  return init;
}

Initializer Initializer::normal(double stddev, double mean) {
  Initializer init(Kind::normal, detail::concat("normal(stddev=", stddev, ", mean=", mean, ")"));
  check(stddev >= 0 && std::isfinite(stddev) && std::isfinite(mean), init.name_,
        "stddev must be finite and non-negative and mean finite");
  init.mean_ = mean;
  init.stddev_ = stddev;
  return init;
}

Initializer Initializer::truncated_normal(double stddev, double mean, double lower, double upper) {
  Initializer init(Kind::truncated_normal, detail::concat("truncated_normal(stddev=", stddev, ", mean=", mean,
                                                          ", lower=", lower, ", upper=", upper, ")"));
  check(stddev >= 0 && std::isfinite(stddev) && std::isfinite(mean), init.name_,
        "stddev must be finite and non-negative and mean finite");
  check(std::isfinite(lower) && std::isfinite(upper) && lower < upper, init.name_,
        "bounds must be finite with lower < upper");
  init.mean_ = mean;
  init.stddev_ = stddev;
  init.lower_ = lower;
  init.upper_ = upper;
  return init;
}

Initializer Initializer::uniform(double low, double high) {
  Initializer init(Kind::uniform, detail::concat("uniform(", low, ", ", high, ")"));
  check(std::isfinite(low) && std::isfinite(high) && low < high, init.name_, "bounds must be finite with low < high");
  init.lower_ = low;
  init.upper_ = high;
  return init;
}

Initializer Initializer::variance_scaling(double scale, FanMode mode, Distribution distribution) {
  Initializer init(Kind::variance_scaling, detail::concat("variance_scaling(", scale, ", ", mode_name(mode), ", ",
                                                          distribution_name(distribution), ")"));
  check(scale >= 0 && std::isfinite(scale), init.name_, "scale must be finite and non-negative");
  init.scale_ = scale;
  init.mode_ = mode;
  init.distribution_ = distribution;
  return init;
}

Initializer Initializer::glorot_normal() {
  return variance_scaling(1.0, FanMode::fan_avg, Distribution::truncated_normal).named("glorot_normal");
}
Initializer Initializer::glorot_uniform() {
  return variance_scaling(1.0, FanMode::fan_avg, Distribution::uniform).named("glorot_uniform");
}
Initializer Initializer::lecun_normal() {
  return variance_scaling(1.0, FanMode::fan_in, Distribution::truncated_normal).named("lecun_normal");
}
Initializer Initializer::lecun_uniform() {
  return variance_scaling(1.0, FanMode::fan_in, Distribution::uniform).named("lecun_uniform");
}
Initializer Initializer::he_normal() {
  return variance_scaling(2.0, FanMode::fan_in, Distribution::truncated_normal).named("he_normal");
}
Initializer Initializer::he_uniform() {
  return variance_scaling(2.0, FanMode::fan_in, Distribution::uniform).named("he_uniform");
}

Initializer Initializer::named(const std::string& alias) const {
  Initializer init = *this;
  init.name_ = kind_ == Kind::constant ? alias : alias + " = " + name_;
  return init;
}

Initializer Initializer::resolve(const Shape& shape, const FanAxes& axes) const {
  const Fans fans = compute_fans(shape, axes, name_);
  const double fan = mode_ == FanMode::fan_in    ? static_cast<double>(fans.in)
                     : mode_ == FanMode::fan_out ? static_cast<double>(fans.out)
                                                 : 0.5 * static_cast<double>(fans.in + fans.out);
  check(fan > 0, name_, mode_name(mode_), " is 0 for shape ", shape, " (fan axes ", fan_axes_str(axes), ")");
  const double variance = scale_ / fan;
  switch (distribution_) {
    case Distribution::normal: return normal(std::sqrt(variance));
    case Distribution::truncated_normal: return truncated_normal(std::sqrt(variance) / truncated_normal_stddev);
    case Distribution::uniform: break;
  }
  const double limit = std::sqrt(3.0 * variance);
  return uniform(-limit, limit);
}

template <class T>
Tensor<T> Initializer::make(const Shape& shape, std::uint64_t seed, const FanAxes& axes, Device device) const {
  const auto mean = static_cast<float>(mean_), stddev = static_cast<float>(stddev_);
  switch (kind_) {
    case Kind::constant: return full<T>(shape, mean_, device);
    case Kind::normal: return randn<T>(shape, seed, mean_, stddev_, device);
    case Kind::truncated_normal: {
      const philox::TruncatedBounds bounds =
          philox::truncated_bounds(static_cast<float>(lower_), static_cast<float>(upper_));
      return detail::draw_tensor<T>(shape, philox::TruncatedNormalDraw{seed, mean, stddev, bounds}, device);
    }
    case Kind::uniform: {
      // Unlike rand_uniform, no step below `high` (the draw's default): each value is the f32 draw rounded.
      const philox::UniformDraw draw{
          .seed = seed, .low = static_cast<float>(lower_), .width = static_cast<float>(upper_ - lower_)};
      return detail::draw_tensor<T>(shape, draw, device);
    }
    case Kind::variance_scaling: break;
  }
  return resolve(shape, axes).make<T>(shape, seed, {}, device);
}

#define TAPEGRAD_INSTANTIATE_INITIALIZER(T) \
  template Tensor<T> Initializer::make<T>(const Shape&, std::uint64_t, const FanAxes&, Device) const;
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_INITIALIZER)

}  // namespace tapegrad

// Parameter initializers that create the tensor directly in the dtype asked for (issue 3: a bf16 parameter must
// not come out as f32). Random values are drawn in f32 from (seed, element index) by the Philox generator and
// rounded once to T, so the bf16, f16 and f64 tensors of one seed equal the f32 tensor rounded to nearest, for
// any thread count. Constants are rounded once from double. Semantics follow flax/JAX (jax.nn.initializers).
//
// On a GPU, make() computes every element by the CPU's formula (tensor/core/detail/random_draws.hpp): constants and
// uniform initializers (uniform, *_uniform) are bitwise the cpu's; normal ones are within randn's bound
// (tensor/factories.hpp); the truncated normal (truncated_normal and the *_normal variance scalings) takes one log
// in erfinv, run in double and rounded to f32, so its standard draw equals the cpu's except where the two doubles
// straddle an f32 rounding boundary; erfinv's polynomial then carries that one ulp to at most 3 ulps of z (checked
// over all 2^24 uniforms with bounds [-2, 2]): within truncated_normal_ulp_bound, after which mean + stddev·z rounds
// as on the cpu.
//
//   Tensor<bf16> w1 = Initializer::lecun_normal().make<bf16>({hidden, ffn}, seed);
//   // a layernorm_mlp kernel [H, 2, F] is two [H, F] matrices: fan_in = H, fan_out = F
//   auto w = Initializer::glorot_uniform().make<bf16>({H, 2, F}, seed, {.in = {0}, .out = {2}, .batch = {1}});
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad {

enum class FanMode : std::uint8_t { fan_in, fan_out, fan_avg };
enum class Distribution : std::uint8_t { normal, truncated_normal, uniform };

// Which axes of a parameter are its input and output features, and which index independent copies (excluded from
// both fans). Axes count from the back when negative. The default is flax's: a shape [..., in, out] whose leading
// dims form a receptive field (a convolution kernel [kh, kw, in, out] has fan_in = kh·kw·in).
struct FanAxes {
  std::vector<int> in{-2};
  std::vector<int> out{-1};
  std::vector<int> batch{};
};

// How far a GPU's truncated standard normal draw may be from the cpu's, in f32 ulps (see the top of this file).
inline constexpr int truncated_normal_ulp_bound = 4;

struct Fans {
  std::int64_t in, out;
};

// fan_in = prod(in dims) · receptive field, fan_out = prod(out dims) · receptive field, where the receptive field
// is the product of the dims in no list. Throws naming `op` and the shape for an axis out of range or repeated.
Fans compute_fans(const Shape& shape, const FanAxes& axes = {}, const std::string& op = "compute_fans");

class Initializer {
 public:
  static Initializer zeros();
  static Initializer ones();
  static Initializer constant(double value);
  // mean + stddev·N(0, 1).
  static Initializer normal(double stddev, double mean = 0.0);
  // mean + stddev·Z with Z a standard normal truncated to [lower, upper] (bounds in units of stddev, as in JAX).
  static Initializer truncated_normal(double stddev, double mean = 0.0, double lower = -2.0, double upper = 2.0);
  // Uniform on [low, high) in f32; rounding to a narrower T may reach `high` (unlike rand_uniform, which steps
  // back below it), because each value is exactly the f32 draw rounded to nearest.
  static Initializer uniform(double low, double high);
  // Variance scale/fan for the fan chosen by `mode` (fan_avg = (fan_in + fan_out)/2): normal with that variance,
  // truncated_normal in [-2, 2] stddevs rescaled so that its variance is that one, or uniform on ±sqrt(3·scale/fan).
  static Initializer variance_scaling(double scale, FanMode mode, Distribution distribution);

  // The named variance-scaling initializers of JAX; their "normal" is the truncated normal, as in JAX.
  static Initializer glorot_normal();   // (1, fan_avg, truncated_normal)
  static Initializer glorot_uniform();  // (1, fan_avg, uniform)
  static Initializer xavier_normal() { return glorot_normal(); }
  static Initializer xavier_uniform() { return glorot_uniform(); }
  static Initializer lecun_normal();    // (1, fan_in, truncated_normal)
  static Initializer lecun_uniform();   // (1, fan_in, uniform)
  static Initializer he_normal();       // (2, fan_in, truncated_normal)
  static Initializer he_uniform();      // (2, fan_in, uniform)
  static Initializer kaiming_normal() { return he_normal(); }
  static Initializer kaiming_uniform() { return he_uniform(); }

  // E.g. "normal(stddev=0.02, mean=0)" or "he_normal = variance_scaling(2, fan_in, truncated_normal)".
  const std::string& name() const { return name_; }

  // A tensor of `shape` in T (f32, f64, bf16 or f16) on `device`. `axes` only matters to variance scaling.
  template <class T>
  Tensor<T> make(const Shape& shape, std::uint64_t seed, const FanAxes& axes = {},
                 Device device = Device::cpu()) const;

 private:
  enum class Kind : std::uint8_t { constant, normal, truncated_normal, uniform, variance_scaling };
  Initializer(Kind kind, std::string name) : kind_(kind), name_(std::move(name)) {}
  Initializer named(const std::string& alias) const;
  // Variance scaling for a given shape: the fixed distribution its fans select.
  Initializer resolve(const Shape& shape, const FanAxes& axes) const;

  Kind kind_;
  std::string name_;
  double mean_ = 0.0, stddev_ = 0.0;  // constant (mean_ is the value), normal, truncated_normal
  double lower_ = 0.0, upper_ = 0.0;  // truncated_normal (in stddevs), uniform (the range)
  double scale_ = 0.0;                // variance_scaling
  FanMode mode_ = FanMode::fan_in;
  Distribution distribution_ = Distribution::normal;
};

}  // namespace tapegrad

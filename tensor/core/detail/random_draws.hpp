// The per-element formulas of the random factories and initializers, written once for the CPU loops
// (tensor/factories.cpp, tensor/initializers.cpp) and the CUDA kernels (tensor/gpu/random.cu), so that the two cannot
// drift: a draw holds its parameters and maps an element index i to the f32 value of element i (the caller rounds
// it to T). Plain C++, no Eigen.
//
// Multiply-adds are explicit fmas: compilers contract `a + b·c` into an fma or not as they please (nvcc does by
// default, g++ does with -march=native on an FMA machine), which would change last bits between devices. With the
// uniform inputs exact and every operation correctly rounded, uniform and integer draws are bitwise equal on every
// device; normal draws take log, cos and sin in double, which the host's libm and CUDA's compute to within an ulp
// or two of a double, and round to f32 once (the bounds that hold: tensor/factories.hpp, tensor/initializers.hpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "tapegrad/tensor/core/detail/host_device.hpp"
#include "tapegrad/tensor/core/detail/philox.hpp"
#include "tapegrad/tensor/core/detail/truncated_normal.hpp"

namespace tapegrad::philox {

// low + width·u with u uniform in [0, 1). After rounding to T, a value that is not below `high` becomes `top` (see
// step_below); the default `high` keeps every value.
struct UniformDraw {
  std::uint64_t seed;
  float low, width;
  double high = INFINITY;
  double top = 0;  // a value of T
  TAPEGRAD_HOST_DEVICE float operator()(std::uint64_t i) const { return std::fma(width, uniform(seed, i), low); }
};

// mean + stddev·z with z standard normal (Box-Muller).
struct NormalDraw {
  std::uint64_t seed;
  float mean, stddev;
  TAPEGRAD_HOST_DEVICE float operator()(std::uint64_t i) const { return std::fma(stddev, normal(seed, i), mean); }
};

// mean + stddev·z with z a standard normal truncated to the bounds.
struct TruncatedNormalDraw {
  std::uint64_t seed;
  float mean, stddev;
  TruncatedBounds bounds;
  TAPEGRAD_HOST_DEVICE float operator()(std::uint64_t i) const {
    return std::fma(stddev, truncated_normal(seed, i, bounds), mean);
  }
};

// An integer in [low, high) (a range of at most 2^32 values).
struct IntegerDraw {
  std::uint64_t seed;
  std::int64_t low, high;
  TAPEGRAD_HOST_DEVICE std::int64_t operator()(std::uint64_t i) const { return integer(seed, i, low, high); }
};

// rand_uniform's half-open rule, applied to a uniform draw already rounded to T (`value`, and `exact`, the same
// number in double): a value that rounding carried up to `high` becomes `top`, the largest T below `high`. An empty
// range [low, low] and the uniform initializer (which keeps each rounded draw as it is) leave `high` infinite.
template <class T> TAPEGRAD_HOST_DEVICE T step_below(T value, double exact, double high, T top) {
  return exact < high ? value : top;
}

}  // namespace tapegrad::philox

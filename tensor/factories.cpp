#include "tapegrad/tensor/factories.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>

#include "tapegrad/tensor/core/detail/op_scope.hpp"
#include "tapegrad/tensor/detail/generate.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"
#include "tapegrad/tensor/gpu/detail/fill.hpp"

namespace tapegrad {

namespace {
// `shape` filled with `value` rounded to T.
template <class T> Tensor<T> filled(const Shape& shape, double value, Device device) {
  Tensor<T> t(shape, device);  // throws for a device this build or machine does not have
  by_device(
      "full", device, [&] { std::fill(t.span().begin(), t.span().end(), convert<T>(value)); },
      [&](auto gpu) {
        check(is_float_dtype_v<T>, "full", "no GPU fill for dtype ", dtype_name(dtype_v<T>));
        cuda::fill(dtype_v<T>, t.data(), t.numel(), value, gpu.index);
      });
  return t;
}
}  // namespace

// Each factory is the op in scope for the errors of the tensor it makes (one too large to address, out of memory).
template <class T> Tensor<T> full(const Shape& shape, double value, Device device) {
  const OpScope scope("full");
  return filled<T>(shape, value, device);
}
template <class T> Tensor<T> zeros(const Shape& shape, Device device) {
  const OpScope scope("zeros");
  return filled<T>(shape, 0.0, device);
}
template <class T> Tensor<T> ones(const Shape& shape, Device device) {
  const OpScope scope("ones");
  return filled<T>(shape, 1.0, device);
}

template <class T> Tensor<T> arange(std::int64_t n) {
  check(n >= 0, "arange", "length must be non-negative, got ", n);
  const OpScope scope("arange");
  Tensor<T> t(Shape{n});
  for (std::int64_t i = 0; i < n; ++i) t.flat(i) = convert<T>(static_cast<double>(i));
  return t;
}

template <class T> Tensor<T> from_vector(const std::vector<T>& values, const Shape& shape) {
  check(static_cast<std::int64_t>(values.size()) == shape.numel(), "from_vector", "got ", values.size(),
        " values for shape ", shape, " which holds ", shape.numel());
  const OpScope scope("from_vector");
  Tensor<T> t(shape);
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

template <class T>
Tensor<T> randn(const Shape& shape, std::uint64_t seed, double mean, double stddev, Device device) {
  check(std::isfinite(mean) && std::isfinite(stddev) && stddev >= 0, "randn",
        "mean and stddev must be finite with stddev >= 0, got mean ", mean, " and stddev ", stddev);
  const OpScope scope("randn");
  return detail::draw_tensor<T>(shape, philox::NormalDraw{seed, static_cast<float>(mean), static_cast<float>(stddev)},
                                device);
}

namespace {
// The next value of T towards -infinity (T an IEEE binary format; x finite).
template <class T> T next_down(T x) {
  using Bits = std::conditional_t<sizeof(T) == 2, std::uint16_t,
                                  std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;
  constexpr Bits sign = Bits(1) << (8 * sizeof(T) - 1);
  const Bits b = std::bit_cast<Bits>(x);
  if (b == 0 || b == sign) return std::bit_cast<T>(Bits(sign | 1));  // from ±0 to the smallest negative subnormal
  return std::bit_cast<T>((b & sign) ? Bits(b + 1) : Bits(b - 1));
}

// The largest T strictly below `high`.
template <class T> T largest_below(double high) {
  T t = convert<T>(high);
  while (!(convert<double>(t) < high)) t = next_down(t);
  return t;
}
}  // namespace

template <class T>
Tensor<T> rand_uniform(const Shape& shape, std::uint64_t seed, double low, double high, Device device) {
  check(std::isfinite(low) && std::isfinite(high), "rand_uniform", "low and high must be finite, got ", low, " and ",
        high);
  check(low <= high, "rand_uniform", "low ", low, " is greater than high ", high);
  const OpScope scope("rand_uniform");
  // Rounding low + width·u (u < 1) to f32, then to T, can land on `high`; such values step back below it. An empty
  // range [low, low] keeps its one value.
  const philox::UniformDraw draw{.seed = seed,
                                 .low = static_cast<float>(low),
                                 .width = static_cast<float>(high - low),
                                 .high = low < high ? high : INFINITY,
                                 .top = convert<double>(largest_below<T>(high))};
  return detail::draw_tensor<T>(shape, draw, device);
}

template <class T>
Tensor<T> rand_int(const Shape& shape, std::uint64_t seed, std::int64_t low, std::int64_t high, Device device) {
  check(low < high, "rand_int", "empty range [", low, ", ", high, ")");
  check(high - low <= (std::int64_t{1} << 32), "rand_int", "range [", low, ", ", high, ") is wider than 2^32");
  const OpScope scope("rand_int");
  return detail::draw_tensor<T>(shape, philox::IntegerDraw{seed, low, high}, device);
}

#define TAPEGRAD_INSTANTIATE_FACTORIES(T)                                                \
  template Tensor<T> zeros<T>(const Shape&, Device);                                          \
  template Tensor<T> ones<T>(const Shape&, Device);                                           \
  template Tensor<T> full<T>(const Shape&, double, Device);                                   \
  template Tensor<T> arange<T>(std::int64_t);                                            \
  template Tensor<T> from_vector<T>(const std::vector<T>&, const Shape&);
#define TAPEGRAD_INSTANTIATE_RANDOM(T)                                                   \
  template Tensor<T> randn<T>(const Shape&, std::uint64_t, double, double, Device);      \
  template Tensor<T> rand_uniform<T>(const Shape&, std::uint64_t, double, double, Device);

TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_FACTORIES)
TAPEGRAD_INSTANTIATE_FACTORIES(std::int32_t)
TAPEGRAD_INSTANTIATE_FACTORIES(std::int64_t)
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_RANDOM)
template Tensor<std::int32_t> rand_int<std::int32_t>(const Shape&, std::uint64_t, std::int64_t, std::int64_t,
                                                     Device);
template Tensor<std::int64_t> rand_int<std::int64_t>(const Shape&, std::uint64_t, std::int64_t, std::int64_t,
                                                     Device);

}  // namespace tapegrad

// Internal to the random factories and initializers: a tensor whose element i is a draw of
// tensor/core/detail/random_draws.hpp rounded to T, on any device.
#pragma once

#include <cstdint>
#include <type_traits>

#include "tapegrad/tensor/core/detail/random_draws.hpp"
#include "tapegrad/tensor/eigen.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"
#include "tapegrad/tensor/gpu/detail/random.hpp"

namespace tapegrad::detail {

// Element i on the cpu: draw(i) rounded to T to nearest even (a uniform draw then steps below its `high`).
template <class T, class Draw> T rounded_draw(const Draw& draw, std::uint64_t i) {
  const T value = convert<T>(draw(i));
  if constexpr (std::is_same_v<Draw, philox::UniformDraw>) {
    return philox::step_below(value, convert<double>(value), draw.high, convert<T>(draw.top));
  } else {
    return value;
  }
}

// A tensor of `shape` on `device` with element i = rounded_draw<T>(draw, i): filled in parallel on the cpu (element i
// depends on i alone, so the chunking cannot matter), by the same formula in cuda::random_fill on a GPU.
template <class T, class Draw> Tensor<T> draw_tensor(const Shape& shape, const Draw& draw, Device device) {
  Tensor<T> t(shape, device);  // throws for a device this build or machine does not have
  by_device(
      "random", device,
      [&] {
        T* out = t.data();
        parallel_for(t.numel(), 40, [&](std::int64_t begin, std::int64_t end) {
          for (std::int64_t i = begin; i < end; ++i) out[i] = rounded_draw<T>(draw, static_cast<std::uint64_t>(i));
        });
      },
      [&](auto gpu) { cuda::random_fill(dtype_v<T>, t.data(), t.numel(), draw, gpu.index); });
  return t;
}

}  // namespace tapegrad::detail

// Internal to the random factories and initializers: fills a tensor element by element from a counter-based draw.
#pragma once

#include <cstdint>

#include "tensor/eigen.hpp"

namespace tapegrad::detail {

// Fills t[i] = draw(i) in parallel; `draw` depends on i alone, so the result does not depend on the chunking.
template <class T, class Draw> Tensor<T> generate(const Shape& shape, Draw draw) {
  Tensor<T> t(shape);
  T* out = t.data();
  parallel_for(t.numel(), 40, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) out[i] = draw(static_cast<std::uint64_t>(i));
  });
  return t;
}

}  // namespace tapegrad::detail

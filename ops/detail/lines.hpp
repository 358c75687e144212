// A tensor seen as lines along one axis: [outer, n, inner], each line the n elements that share an (outer, inner)
// position. softmax, log_softmax and cross_entropy reduce along such lines. Internal: included by ops/*.cpp only.
#pragma once

#include <algorithm>
#include <cstdint>

#include "tapegrad/tensor/eigen.hpp"

namespace tapegrad::detail {

struct AxisLayout {
  std::int64_t outer = 1, n = 1, inner = 1;
  std::int64_t lines() const { return outer * inner; }
};

// The layout of `shape` around `axis` (negative counts from the back); throws naming `op` for a bad axis.
inline AxisLayout axis_layout(const Shape& shape, int axis, const char* op) {
  const auto a = static_cast<int>(shape.normalize_axis(axis, op));
  AxisLayout l;
  for (int i = 0; i < a; ++i) l.outer *= shape[i];
  l.n = shape[a];
  for (int i = a + 1; i < shape.rank(); ++i) l.inner *= shape[i];
  return l;
}

// Visits every line, in parallel, as runs of neighbouring lines of one outer slice: body(at, line, width) for
// lines [line, line + width), where element k of line (line + i) sits at flat index at + k * inner + i. Walking
// a run k-major keeps memory access contiguous whatever the axis.
template <class Body> void for_each_line_run(const AxisLayout& l, std::int64_t cost_per_line, Body&& body) {
  parallel_for(l.lines(), cost_per_line, [&](std::int64_t begin, std::int64_t end) {
    while (begin < end) {
      const std::int64_t o = begin / l.inner, i = begin % l.inner;
      const std::int64_t width = std::min(end - begin, l.inner - i);
      body(o * l.n * l.inner + i, begin, width);
      begin += width;
    }
  });
}

// Calls f(index, i) for each element of a run, k-major: `index` is the flat element index, `i` its line in the run.
template <class F> void for_each_in_run(const AxisLayout& l, std::int64_t at, std::int64_t width, F&& f) {
  for (std::int64_t k = 0; k < l.n; ++k) {
    for (std::int64_t i = 0; i < width; ++i) f(at + k * l.inner + i, i);
  }
}

}  // namespace tapegrad::detail

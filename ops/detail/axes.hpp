// Checking lists of axes that ops take (reductions, permutations), with errors that name the op and the shape.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/shape.hpp"

namespace tapegrad {

// A list printed as "[2, -1]": formatted only when printed, so that check() formats it only on failure.
template <class I> struct Listed {
  const std::vector<I>& values;
};
template <class I> std::ostream& operator<<(std::ostream& out, const Listed<I>& list) {
  out << "[";
  for (std::size_t i = 0; i < list.values.size(); ++i) out << (i ? ", " : "") << list.values[i];
  return out << "]";
}
template <class I> std::string list_str(const std::vector<I>& values) { return detail::concat(Listed<I>{values}); }

// `axes` as axes of `shape` in [0, rank), in the order given (negative ones count from the back); throws naming
// `op` when one is out of range or two name the same axis.
inline std::vector<int> normalize_axes(const Shape& shape, const std::vector<int>& axes, const char* op) {
  std::vector<int> normalized;
  std::vector<bool> seen(static_cast<std::size_t>(shape.rank()), false);
  for (int axis : axes) {
    const std::size_t a = shape.normalize_axis(axis, op);
    check(!seen[a], op, "axes ", Listed{axes}, " name axis ", a, " twice for shape ", shape);
    seen[a] = true;
    normalized.push_back(static_cast<int>(a));
  }
  return normalized;
}

// The product of shape[begin], ..., shape[end - 1] (1 when the range is empty).
inline std::int64_t numel_between(const Shape& shape, int begin, int end) {
  std::int64_t n = 1;
  for (int i = begin; i < end; ++i) n *= shape[i];
  return n;
}

}  // namespace tapegrad

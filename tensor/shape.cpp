#include "tapegrad/tensor/shape.hpp"

#include <algorithm>
#include <ostream>
#include <sstream>

#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/core/detail/op_scope.hpp"

namespace tapegrad {

Shape::Shape(std::initializer_list<std::int64_t> dims) : Shape(std::span<const std::int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const std::int64_t> dims) {
  if (dims.size() > static_cast<std::size_t>(max_rank)) {
    std::ostringstream s;
    s << "[";
    for (std::size_t i = 0; i < dims.size(); ++i) s << (i ? ", " : "") << dims[i];
    s << "]";
    throw Error("shape: rank " + std::to_string(dims.size()) + " of " + s.str() + " exceeds the maximum rank 8");
  }
  rank_ = static_cast<int>(dims.size());
  std::copy(dims.begin(), dims.end(), dims_.begin());
  // The product of the non-zero dimensions bounds every stride and partial product that numel() and strides() form.
  std::int64_t product = 1;
  for (int i = 0; i < rank_; ++i) {
    const std::int64_t d = dims_[static_cast<std::size_t>(i)];
    if (d < 0) throw Error(detail::concat(current_op("shape"), ": negative dimension in ", *this));
    if (d != 0 && __builtin_mul_overflow(product, d, &product)) {
      throw Error(detail::concat(current_op("shape"), ": the dimensions ", *this,
                                 " multiply to more than 2^63 - 1 elements, which an int64 cannot count"));
    }
  }
  numel_ = std::find(dims_.begin(), dims_.begin() + rank_, 0) != dims_.begin() + rank_ ? 0 : product;
}

std::size_t Shape::normalize_axis(int axis, const char* op) const {
  const int a = axis < 0 ? axis + rank_ : axis;
  check(a >= 0 && a < rank_, op, "axis ", axis, " is out of range for shape ", *this, " of rank ", rank_);
  return static_cast<std::size_t>(a);
}

std::array<std::int64_t, Shape::max_rank> Shape::strides() const {
  std::array<std::int64_t, max_rank> s{};
  std::int64_t step = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    s[static_cast<std::size_t>(i)] = step;
    step *= dims_[static_cast<std::size_t>(i)];
  }
  return s;
}

std::string Shape::str() const {
  std::ostringstream out;
  out << *this;
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Shape& s) {
  out << "[";
  for (int i = 0; i < s.rank(); ++i) out << (i ? ", " : "") << s[i];
  return out << "]";
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const int rank = std::max(a.rank(), b.rank());
  std::vector<std::int64_t> dims(static_cast<std::size_t>(rank));
  for (int i = 0; i < rank; ++i) {
    const int ia = a.rank() - rank + i, ib = b.rank() - rank + i;
    const std::int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    check(da == db || da == 1 || db == 1, op, "shapes ", a, " and ", b, " cannot be broadcast together");
    dims[static_cast<std::size_t>(i)] = da == 1 ? db : da;
  }
  return Shape(dims);
}

bool broadcastable(std::span<const Shape> shapes) {
  int rank = 0;
  for (const Shape& s : shapes) rank = std::max(rank, s.rank());
  for (int back = 1; back <= rank; ++back) {
    std::int64_t common = 1;
    for (const Shape& s : shapes) {
      const std::int64_t d = back <= s.rank() ? s[s.rank() - back] : 1;
      if (d == 1) continue;
      if (common != 1 && d != common) return false;
      common = d;
    }
  }
  return true;
}

}  // namespace tapegrad

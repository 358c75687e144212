#include "tensor/shape.hpp"

#include <algorithm>
#include <ostream>
#include <sstream>

#include "tensor/error.hpp"

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
  for (int i = 0; i < rank_; ++i) {
    if (dims_[static_cast<std::size_t>(i)] < 0) throw Error("shape: negative dimension in " + str());
  }
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

bool operator==(const Shape& a, const Shape& b) {
  return a.rank_ == b.rank_ && std::equal(a.dims_.begin(), a.dims_.begin() + a.rank_, b.dims_.begin());
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

}  // namespace tapegrad

// Shape of a tensor: rank 0..8, row-major.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <span>
#include <string>
#include <vector>

namespace tapegrad {

class Shape {
 public:
  static constexpr int max_rank = 8;

  Shape() = default;  // rank 0: a scalar
  Shape(std::initializer_list<std::int64_t> dims);
  explicit Shape(std::span<const std::int64_t> dims);
  explicit Shape(const std::vector<std::int64_t>& dims) : Shape(std::span<const std::int64_t>(dims)) {}

  int rank() const { return rank_; }
  // Kept from construction: loops test `i < t.numel()` on every step, and element access checks its index.
  std::int64_t numel() const { return numel_; }
  std::int64_t operator[](int axis) const { return dims_[static_cast<std::size_t>(axis)]; }
  // Dimension at `axis`, counting from the back when negative; throws naming `op` when out of range.
  std::int64_t dim(int axis, const char* op = "shape") const { return dims_[normalize_axis(axis, op)]; }
  std::size_t normalize_axis(int axis, const char* op) const;

  std::span<const std::int64_t> dims() const { return {dims_.data(), static_cast<std::size_t>(rank_)}; }
  std::vector<std::int64_t> to_vector() const { return {dims_.begin(), dims_.begin() + rank_}; }
  // Row-major strides in elements.
  std::array<std::int64_t, max_rank> strides() const;

  std::string str() const;  // "[2, 3]"
  // Inline: compared on every elementwise op, usually at rank 1 or 2.
  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_ || a.numel_ != b.numel_) return false;
    for (int i = 0; i < a.rank_; ++i) {
      if (a.dims_[static_cast<std::size_t>(i)] != b.dims_[static_cast<std::size_t>(i)]) return false;
    }
    return true;
  }

 private:
  std::array<std::int64_t, max_rank> dims_{};
  int rank_ = 0;
  std::int64_t numel_ = 1;
};

std::ostream& operator<<(std::ostream& out, const Shape& s);

// NumPy broadcasting of two shapes; throws an Error naming `op` and both shapes when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Whether all of `shapes` broadcast together (NumPy rules: on each axis from the back, every size is 1 or one value).
bool broadcastable(std::span<const Shape> shapes);

}  // namespace tapegrad

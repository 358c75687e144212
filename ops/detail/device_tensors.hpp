// What the GPU halves of ops/ share: tensors padded or cropped together in one launch, and parameter gradients
// summed in the compute type and rounded once to the parameter's dtype. Internal to ops/.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "tapegrad/cuda/reduce.hpp"
#include "tapegrad/cuda/row_copy.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::detail {

// Tensors resized together, in one launch (a step's paddings, or its crops): add(t, shape) is t in the leading corner
// of a tensor of `shape`, zero elsewhere (padding), or the leading corner `shape` of t (cropping); t itself where it
// has that shape. The tensor it returns holds the copy once run() has queued it. Only the first and last axes may
// differ: a copy moves whole rows of the last axis, rows added or dropped at the end.
template <class T> class Resizes {
 public:
  Tensor<T> add(const Tensor<T>& t, const Shape& shape) {
    if (t.shape() == shape) return t;
    const int rank = shape.rank();
    bool alike = rank > 0 && t.shape().rank() == rank;
    for (int a = 1; alike && a + 1 < rank; ++a) alike = t.shape().dim(a) == shape.dim(a);
    check(alike, "resize", "cannot resize ", t.shape(), " to ", shape,
          " (only the first and last axes may differ)");
    if (copies_.size() == cuda::max_row_copies) run();
    Tensor<T> out(shape, t.device());
    copies_.push_back(
        {t.data(), rows(t.shape()), t.shape().dim(rank - 1), out.data(), rows(shape), shape.dim(rank - 1)});
    sources_.push_back(t);  // a temporary (a cast) stays alive until its copy is queued
    return out;
  }
  void run() {
    if (copies_.empty()) return;
    cuda::copy_rows(dtype_v<T>, copies_, sources_.front().device().index);
    copies_.clear();
    sources_.clear();
  }

 private:
  static std::int64_t rows(const Shape& s) {
    std::int64_t n = 1;
    for (int a = 0; a + 1 < s.rank(); ++a) n *= s.dim(a);
    return n;
  }
  std::vector<cuda::RowCopy> copies_;
  std::vector<Tensor<T>> sources_;
};

template <class T> Tensor<T> resized(const Tensor<T>& t, const Shape& shape) {
  Resizes<T> one;
  Tensor<T> out = one.add(t, shape);
  one.run();
  return out;
}

// A parameter gradient summed in C = compute_t<T> and rounded once to P. Launchers write it (in the padded shape)
// straight into P where P is T (their output in T) or C (their wide output); any other P gets it in C, then a cast.
template <class P, class T> class ParamGrad {
  using C = compute_t<T>;
  using Written = std::conditional_t<std::is_same_v<P, T>, T, C>;

 public:
  static constexpr bool wide = !std::is_same_v<P, T>;  // what the launcher is asked for
  ParamGrad(const Shape& shape, const Shape& padded_shape, Device device)
      : shape_(shape), written_(padded_shape, device) {}
  void* data() { return written_.data(); }
  // The gradient in P. Given `crops` where P is T, its crop is queued there (the tensor returned holds it once they
  // have run); otherwise cropped and cast now, which frees the gradient in C early.
  Tensor<P> result(Resizes<T>* crops = nullptr) const {
    if constexpr (std::is_same_v<P, T>) {
      if (crops) return crops->add(written_, shape_);
    }
    const Tensor<Written> out = resized(written_, shape_);
    if constexpr (std::is_same_v<P, Written>) return out;
    else return cast<P>(out);
  }

 private:
  Shape shape_;
  Tensor<Written> written_;
};

// Σ_rows of t [M, width] (summed in T's accumulation type) as P [shape].
template <class P, class T> Tensor<P> column_sums(const Tensor<T>& t, std::int64_t width, const Shape& shape) {
  ParamGrad<P, T> sums(shape, shape, t.device());
  cuda::sum(dtype_v<T>, t.data(), {{t.numel() / width, width}, {true, false}}, 1.0, sums.data(), t.device().index,
            ParamGrad<P, T>::wide);
  return sums.result();
}

}  // namespace tapegrad::detail

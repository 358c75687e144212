// Eigen Tensor views of tapegrad tensors, and the CPU execution context the ops run on.
#pragma once

#ifndef EIGEN_USE_THREADS
#error "tapegrad is built with EIGEN_USE_THREADS; use the tapegrad dependency's compile arguments"
#endif
#include <unsupported/Eigen/CXX11/Tensor>

#include <array>
#include <cstdint>
#include <functional>

#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad {

template <class T, int Rank> using TensorView = Eigen::TensorMap<Eigen::Tensor<T, Rank, Eigen::RowMajor, Eigen::Index>>;
template <class T, int Rank>
using ConstTensorView = Eigen::TensorMap<const Eigen::Tensor<T, Rank, Eigen::RowMajor, Eigen::Index>>;

// A rank-`Rank` Eigen view of a tensor whose shape is given explicitly (it must have t.numel() elements).
template <int Rank, class T>
TensorView<T, Rank> view_as(Tensor<T>& t, const std::array<Eigen::Index, Rank>& dims) {
  return TensorView<T, Rank>(t.data(), dims);
}
template <int Rank, class T>
ConstTensorView<T, Rank> view_as(const Tensor<T>& t, const std::array<Eigen::Index, Rank>& dims) {
  return ConstTensorView<T, Rank>(t.data(), dims);
}
// The tensor seen as a flat vector.
template <class T> TensorView<T, 1> flat_view(Tensor<T>& t) { return view_as<1>(t, {t.numel()}); }
template <class T> ConstTensorView<T, 1> flat_view(const Tensor<T>& t) { return view_as<1>(t, {t.numel()}); }
// The tensor seen as a matrix [prod(leading dims), last dim].
template <class T> TensorView<T, 2> matrix_view(Tensor<T>& t) {
  const std::int64_t cols = t.rank() ? t.dim(-1) : 1;
  return view_as<2>(t, {cols ? t.numel() / cols : 0, cols});
}
template <class T> ConstTensorView<T, 2> matrix_view(const Tensor<T>& t) {
  const std::int64_t cols = t.rank() ? t.dim(-1) : 1;
  return view_as<2>(t, {cols ? t.numel() / cols : 0, cols});
}

// The shared thread pool. Work smaller than `parallel_threshold` elements runs on the calling thread.
Eigen::ThreadPoolDevice& cpu_pool();
void set_num_threads(int threads);
int num_threads();
inline constexpr std::int64_t parallel_threshold = 1 << 15;

// Evaluates `out = expr` (or another assignment) on the pool when the work is large enough.
template <class Assign> void run_on_cpu(std::int64_t work, Assign&& assign) {
  if (work >= parallel_threshold && num_threads() > 1) {
    assign(cpu_pool());
  } else {
    Eigen::DefaultDevice device;
    assign(device);
  }
}

// Calls body(begin, end) over [0, n) in chunks on the pool; the calling thread waits for all of them.
void parallel_for(std::int64_t n, std::int64_t cost_per_item, const std::function<void(std::int64_t, std::int64_t)>& body);

}  // namespace tapegrad

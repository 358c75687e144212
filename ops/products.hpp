// The CPU's products for the ops that multiply through GEMMs of their own (layernorm_mlp, fp8_dense): one rounding
// to T of a sum accumulated in C = compute_t<T>, and weight and bias gradients kept in C. Internal to ops/.
#pragma once

#include <cstdint>
#include <vector>

#include "tapegrad/ops/gemm.hpp"
#include "tapegrad/ops/row_sum.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::detail {

// What a product adds to op(A) · op(B): nothing, a row [N] to every row (a bias), or a whole [M, N] matrix.
template <class T> struct Addend {
  const T* row = nullptr;
  const T* matrix = nullptr;
};

// out [M, N] = op(A) · op(B) + the addend, accumulated in C and rounded to T once: row-major A [M, K] (or [K, M]
// transposed), B [K, N] (or [N, K]). X is T, or C for fp8's quantized operands.
template <class T, class X>
Tensor<T> product(Transpose ta, Transpose tb, std::int64_t M, std::int64_t N, std::int64_t K, const Tensor<X>& a,
                  const Tensor<X>& b, Addend<T> add = {}) {
  Tensor<X> out(Shape{M, N});
  if (add.row || add.matrix) {
    for (std::int64_t r = 0; r < M; ++r) {
      const T* from = add.row ? add.row : add.matrix + r * N;
      for (std::int64_t j = 0; j < N; ++j) out.data()[r * N + j] = convert<X>(from[j]);
    }
  }
  gemm<X>(ta, tb, M, N, K, 1, a.data(), ta == Transpose::no ? K : M, b.data(), tb == Transpose::no ? N : K,
          add.row || add.matrix ? 1 : 0, out.data(), N);
  return cast<T>(out);
}

// A bias as an addend (none when undefined).
template <class T> Addend<T> bias_rows(const Tensor<T>& bias) { return {bias.defined() ? bias.data() : nullptr}; }

// Aᵀ · B over M rows, in C: A [M, K1], B [M, K2] → [K1, K2]. The weight gradients keep C's precision until they
// are rounded to the parameter dtype.
template <class T>
Tensor<compute_t<T>> weight_gradient(const Tensor<T>& a, const Tensor<T>& b, std::int64_t M, std::int64_t k1,
                                     std::int64_t k2) {
  using C = compute_t<T>;
  const Tensor<C> ac = cast<C>(a), bc = cast<C>(b);
  Tensor<C> out(Shape{k1, k2});
  gemm<C>(Transpose::yes, Transpose::no, k1, k2, M, 1, ac.data(), k1, bc.data(), k2, 0, out.data(), k2);
  return out;
}

// Σ_rows of t [M, width] in C (a bias gradient), bitwise the same for every thread count.
template <class T> std::vector<compute_t<T>> column_sums(const Tensor<T>& t, std::int64_t rows, std::int64_t width) {
  using C = compute_t<T>;
  return blocked_row_sum<C>(rows, width, width, [&](std::int64_t begin, std::int64_t end, C* sums) {
    Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>> total(sums, width);
    for (std::int64_t r = begin; r < end; ++r) {
      total += Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(t.data() + r * width, width).template cast<C>();
    }
  });
}

}  // namespace tapegrad::detail

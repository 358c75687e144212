// The CPU's products of operands (ops/fp8/detail/operand.hpp) for the ops that multiply through GEMMs of their own
// (layernorm_mlp, fp8_dense): one rounding to T of a sum accumulated in C = compute_t<T>, and weight and bias gradients
// kept in C. Values multiply as T, quantized operands as the C values their codes stand for. Internal to ops/.
#pragma once

#include <cstdint>
#include <vector>

#include "tapegrad/ops/detail/row_sum.hpp"
#include "tapegrad/ops/fp8/detail/operand.hpp"
#include "tapegrad/ops/detail/gemm.hpp"
#include "tapegrad/tensor/factories.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::detail {

// What a product adds to op(A) · op(B): nothing, a row [N] to every row (a bias), a whole [M, N] matrix, or both.
template <class T> struct Addend {
  const T* row = nullptr;
  const T* matrix = nullptr;
};

// A bias as an addend (none when undefined).
template <class T> Addend<T> bias_rows(const Tensor<T>& bias) { return {bias.defined() ? bias.data() : nullptr}; }

// out [M, N] = A · op(B) + the addend, accumulated in C and rounded to T once: row-major A [M, K], B [K, N] (or [N, K]
// transposed). X is T, or C for quantized operands (with X = T, a row and a matrix are added in T before the product).
template <class T, class X>
Tensor<T> product_of(Transpose tb, std::int64_t M, std::int64_t N, std::int64_t K, const Tensor<X>& a,
                     const Tensor<X>& b, Addend<T> add) {
  Tensor<X> out(Shape{M, N});
  if (add.row || add.matrix) {
    for (std::int64_t r = 0; r < M; ++r) {
      for (std::int64_t j = 0; j < N; ++j) {
        X v = add.row ? convert<X>(add.row[j]) : X(0);
        if (add.matrix) v += convert<X>(add.matrix[r * N + j]);
        out.data()[r * N + j] = v;
      }
    }
  }
  gemm<X>(Transpose::no, tb, M, N, K, 1, a.data(), K, b.data(), tb == Transpose::no ? N : K,
          add.row || add.matrix ? 1 : 0, out.data(), N);
  return cast<T>(out);
}

// out [M, N] = a · op(w) + the addend: a [M, K] read along its columns, the weight w [K, N] (or [N, K] transposed).
template <class T>
Tensor<T> product(const Operand<T>& a, const Operand<T>& w, Transpose tw, std::int64_t M, std::int64_t N,
                  std::int64_t K, Addend<T> add = {}) {
  if (!a.quantized()) return product_of(tw, M, N, K, a.values, w.values, add);
  return product_of(tw, M, N, K, a.along_columns, w.along_columns, add);
}

// aᵀ · b over M rows, in C: a [M, K1] and b [M, K2], read along their rows, → [K1, K2]. The weight gradients keep C's
// precision until they are rounded to the parameter dtype.
template <class T>
Tensor<compute_t<T>> weight_gradient(const Operand<T>& a, const Operand<T>& b, std::int64_t M, std::int64_t k1,
                                     std::int64_t k2) {
  using C = compute_t<T>;
  const Tensor<C> ac = a.quantized() ? a.along_rows : cast<C>(a.values);
  const Tensor<C> bc = b.quantized() ? b.along_rows : cast<C>(b.values);
  Tensor<C> out(Shape{k1, k2});
  gemm<C>(Transpose::yes, Transpose::no, k1, k2, M, 1, ac.data(), k1, bc.data(), k2, 0, out.data(), k2);
  return out;
}

// Σ_rows of t [M, width] in C (a bias gradient), bitwise the same for every thread count.
template <class T> Tensor<compute_t<T>> column_sums(const Tensor<T>& t, std::int64_t rows, std::int64_t width) {
  using C = compute_t<T>;
  const std::vector<C> sums = blocked_row_sum<C>(rows, width, width, [&](std::int64_t begin, std::int64_t end, C* s) {
    Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>> total(s, width);
    for (std::int64_t r = begin; r < end; ++r) {
      total += Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(t.data() + r * width, width).template cast<C>();
    }
  });
  return from_vector(sums, Shape{width});
}

}  // namespace tapegrad::detail

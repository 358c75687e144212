// GEMM dispatch: Eigen for small products; for larger f32/f64 ones the engine measured faster for the shape
// (ops/detail/gemm_choice.hpp), Eigen's or CBLAS.
//
// Eigen path: up to 2^20 multiply-adds Eigen's matrix product (one thread); above, the Tensor contraction, which
// pairs op(A)'s K axis with op(B)'s, so the transposes are contraction axes, never copies, and the free axes come
// out as [M, N] in all four cases. Eigen's tensor maps need contiguous rows, so an operand with a leading dimension
// wider than its rows is packed first (O(MK), next to the O(MNK) product). alpha, beta and a strided C are applied
// in one pass over a contiguous product.
// bf16/f16: both operands are widened to f32 (packing them), multiplied by the f32 path, and C is rounded once.
#include "tapegrad/ops/detail/gemm.hpp"

#include <atomic>
#include <chrono>
#include <climits>
#include <type_traits>

#include "tapegrad/ops/detail/gemm_choice.hpp"
#include "tapegrad/tensor/eigen.hpp"
#include "tapegrad/tensor/factories.hpp"

#ifdef TAPEGRAD_HAVE_CBLAS
#include <cblas.h>
#endif

namespace tapegrad {

namespace {

using detail::GemmEngine;

// The extent a matrix is stored with: op(X) is [rows, cols] when not transposed.
struct Extent {
  std::int64_t rows, cols;
};
Extent stored(Transpose t, std::int64_t rows, std::int64_t cols) {
  return t == Transpose::yes ? Extent{cols, rows} : Extent{rows, cols};
}

// A contiguous copy, converted to To, of a matrix of extent `e` whose rows are `ld` apart.
template <class To, class From> Tensor<To> pack(const From* src, Extent e, std::int64_t ld) {
  Tensor<To> out(Shape{e.rows, e.cols});
  To* dst = out.data();
  parallel_for(e.rows, e.cols, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      for (std::int64_t j = 0; j < e.cols; ++j) dst[i * e.cols + j] = convert<To>(src[i * ld + j]);
    }
  });
  return out;
}

// C = alpha · P + beta · C for a contiguous [M, N] product P computed in P's type; rounds to T once.
template <class T, class P>
void store(const P* product, std::int64_t M, std::int64_t N, P alpha, P beta, T* C, std::int64_t ldc) {
  parallel_for(M, N, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      for (std::int64_t j = 0; j < N; ++j) {
        P v = alpha * product[i * N + j];
        if (beta != P(0)) v += beta * convert<P>(C[i * ldc + j]);
        C[i * ldc + j] = convert<T>(v);
      }
    }
  });
}

// Up to this many multiply-adds the Eigen engine is Eigen's matrix product on one thread, on every thread count: at
// these sizes it beats the contraction (whose setup and hand-off to the pool cost more than the pool saves), and
// the rule depending on the size alone keeps the bits independent of the thread count.
constexpr std::int64_t matrix_product_max_work = std::int64_t{1} << 20;

template <class T> using RowMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// C = alpha · op(A) · op(B) + beta · C through Eigen's matrix product, strides and transposes as views.
template <class T>
void matrix_product(Transpose trans_a, Transpose trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha,
                    const T* A, std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  using Const = Eigen::Map<const RowMajorMatrix<T>, 0, Eigen::OuterStride<>>;
  const Extent ea = stored(trans_a, M, K), eb = stored(trans_b, K, N);
  const Const a(A, ea.rows, ea.cols, Eigen::OuterStride<>(lda)), b(B, eb.rows, eb.cols, Eigen::OuterStride<>(ldb));
  Eigen::Map<RowMajorMatrix<T>, 0, Eigen::OuterStride<>> c(C, M, N, Eigen::OuterStride<>(ldc));
  if (beta == T(0)) {
    c.setZero();  // C may hold anything, NaN included
  } else if (beta != T(1)) {
    c *= beta;
  }
  const auto add = [&](const auto& x, const auto& y) { c.noalias() += alpha * (x * y); };
  const bool ta = trans_a == Transpose::yes, tb = trans_b == Transpose::yes;
  if (ta && tb) add(a.transpose(), b.transpose());
  else if (ta) add(a.transpose(), b);
  else if (tb) add(a, b.transpose());
  else add(a, b);
}

template <class T>
void eigen_gemm(Transpose trans_a, Transpose trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha,
                const T* A, std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  if (M * N * K <= matrix_product_max_work) {
    matrix_product(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const Extent ea = stored(trans_a, M, K), eb = stored(trans_b, K, N);
  Tensor<T> a_packed, b_packed;  // only for strided operands
  if (lda != ea.cols) {
    a_packed = pack<T>(A, ea, lda);
    A = a_packed.data();
  }
  if (ldb != eb.cols) {
    b_packed = pack<T>(B, eb, ldb);
    B = b_packed.data();
  }
  const ConstTensorView<T, 2> a(A, ea.rows, ea.cols), b(B, eb.rows, eb.cols);
  const std::array<Eigen::IndexPair<Eigen::Index>, 1> axes{
      {{trans_a == Transpose::yes ? 0 : 1, trans_b == Transpose::yes ? 1 : 0}}};
  const bool direct = alpha == T(1) && beta == T(0) && ldc == N;
  Tensor<T> product = direct ? Tensor<T>() : Tensor<T>(Shape{M, N});
  TensorView<T, 2> out(direct ? C : product.data(), M, N);
  run_on_cpu(M * N * K, [&](auto& device) { out.device(device) = a.contract(b, axes); });
  if (!direct) store(product.data(), M, N, alpha, beta, C, ldc);
}

#ifdef TAPEGRAD_HAVE_CBLAS
CBLAS_TRANSPOSE blas_transpose(Transpose t) { return t == Transpose::yes ? CblasTrans : CblasNoTrans; }

// OpenBLAS keeps its own threads: give it as many as tapegrad's pool, re-set only when set_num_threads changed it.
void sync_blas_threads() {
  static std::atomic<int> blas_threads{0};
  const int n = num_threads();
  if (blas_threads.exchange(n) != n) openblas_set_num_threads(n);
}

void blas_gemm(Transpose ta, Transpose tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
               int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, blas_transpose(ta), blas_transpose(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void blas_gemm(Transpose ta, Transpose tb, int M, int N, int K, double alpha, const double* A, int lda,
               const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, blas_transpose(ta), blas_transpose(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// The engine faster_engine finds for this problem, as a path.
template <class T, class Seconds>
GemmPath measured_path(Transpose trans_a, Transpose trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                       const Seconds& seconds) {
  const detail::GemmProblem problem{M, N, K, trans_a, trans_b, std::is_same_v<T, double>};
  return detail::faster_engine(problem, seconds) == detail::GemmEngine::blas ? GemmPath::blas : GemmPath::eigen;
}

bool fits_int(std::initializer_list<std::int64_t> values) {
  for (std::int64_t v : values) {
    if (v > INT_MAX) return false;
  }
  return true;
}
#endif

template <class T>
void float_gemm(Transpose trans_a, Transpose trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha,
                const T* A, std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc,
                GemmPath path) {
  check(path != GemmPath::blas || gemm_has_blas(), "gemm", "the BLAS path was asked for, but tapegrad was built "
                                                           "without a CBLAS (meson option blas)");
#ifdef TAPEGRAD_HAVE_CBLAS
  const bool fits = fits_int({M, N, K, lda, ldb, ldc});
  // The first `rows` rows of the product (all of them but when measuring a large one).
  const auto blas = [&](std::int64_t rows, T* out, T out_beta, std::int64_t ld_out) {
    check(fits, "gemm", "sizes M ", M, ", N ", N, ", K ", K, " or the leading dimensions exceed the CBLAS int range");
    sync_blas_threads();
    blas_gemm(trans_a, trans_b, static_cast<int>(rows), static_cast<int>(N), static_cast<int>(K), alpha, A,
              static_cast<int>(lda), B, static_cast<int>(ldb), out_beta, out, static_cast<int>(ld_out));
  };
  const std::int64_t work = M * N * K;
  if (path == GemmPath::automatic && fits && work >= blas_min_work) {
    path = measured_path<T>(trans_a, trans_b, M, N, K, [&](GemmEngine e, std::int64_t rows) {
      Tensor<T> scratch(Shape{rows, N});  // the product into scratch (C may be read by beta)
      const auto start = std::chrono::steady_clock::now();
      if (e == GemmEngine::blas) blas(rows, scratch.data(), T(0), N);
      else eigen_gemm(trans_a, trans_b, rows, N, K, alpha, A, lda, B, ldb, T(0), scratch.data(), N);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }
  if (path == GemmPath::blas) {
    blas(M, C, beta, ldc);
    return;
  }
#endif
  eigen_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace

bool gemm_has_blas() {
#ifdef TAPEGRAD_HAVE_CBLAS
  return true;
#else
  return false;
#endif
}

template <class T>
void gemm(Transpose trans_a, Transpose trans_b, std::int64_t M, std::int64_t N, std::int64_t K, compute_t<T> alpha,
          const T* A, std::int64_t lda, const T* B, std::int64_t ldb, compute_t<T> beta, T* C, std::int64_t ldc,
          GemmPath path) {
  using P = compute_t<T>;
  check(M >= 0 && N >= 0 && K >= 0, "gemm", "negative size M ", M, ", N ", N, ", K ", K);
  const Extent ea = stored(trans_a, M, K), eb = stored(trans_b, K, N);
  check(lda >= ea.cols && ldb >= eb.cols && ldc >= N, "gemm", "leading dimensions lda ", lda, ", ldb ", ldb,
        ", ldc ", ldc, " are smaller than the rows of A [", ea.rows, ", ", ea.cols, "], B [", eb.rows, ", ", eb.cols,
        "] or C [", M, ", ", N, "]");
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: C = beta · C (CBLAS rejects the zero leading dimensions this may come with)
    store(zeros<P>(Shape{M, N}).data(), M, N, P(0), beta, C, ldc);
  } else if constexpr (is_half_precision_v<T>) {
    const Tensor<P> a = pack<P>(A, ea, lda), b = pack<P>(B, eb, ldb);
    Tensor<P> product(Shape{M, N});
    float_gemm<P>(trans_a, trans_b, M, N, K, alpha, a.data(), ea.cols, b.data(), eb.cols, P(0), product.data(), N,
                  path);
    store(product.data(), M, N, P(1), beta, C, ldc);
  } else {
    float_gemm<T>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, path);
  }
}

#define TAPEGRAD_INSTANTIATE_GEMM(T)                                                                           \
  template void gemm<T>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, compute_t<T>, const T*, \
                        std::int64_t, const T*, std::int64_t, compute_t<T>, T*, std::int64_t, GemmPath);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_GEMM)

}  // namespace tapegrad

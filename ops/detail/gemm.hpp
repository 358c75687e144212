// The raw matrix product every dense op uses: C = alpha · op(A) · op(B) + beta · C on row-major matrices.
//
// op(A) is [M, K]: A is stored [M, K] (Transpose::no) or [K, M] (Transpose::yes), each row `lda` elements apart;
// likewise op(B) is [K, N] and C is [M, N] with leading dimensions ldb and ldc. beta == 0 never reads C.
// Small products run as an Eigen Tensor contraction (on the thread pool when large enough); products of at least
// `blas_min_work` multiply-adds, when the build has a CBLAS, run on the engine measured faster for their shape
// (ops/detail/gemm_choice.hpp: Eigen's contraction or CBLAS). bf16/f16 operands are widened to f32, multiplied and
// accumulated in f32, and rounded to T once.
#pragma once

#include <cstdint>

#include "tapegrad/tensor/dtype.hpp"

namespace tapegrad {

enum class Transpose : bool { no, yes };

// Which kernel runs the product; `automatic` picks by size and measurement. Forcing one is for tests and benchmarks.
enum class GemmPath { automatic, eigen, blas };

// M·N·K at and above which `automatic` chooses between Eigen and CBLAS by measurement; below it the op's own
// overhead outweighs the kernel and Eigen's contraction runs.
inline constexpr std::int64_t blas_min_work = std::int64_t{64} * 64 * 64;

// Whether this build has a CBLAS; GemmPath::blas throws without one.
bool gemm_has_blas();

template <class T>
void gemm(Transpose trans_a, Transpose trans_b, std::int64_t M, std::int64_t N, std::int64_t K, compute_t<T> alpha,
          const T* A, std::int64_t lda, const T* B, std::int64_t ldb, compute_t<T> beta, T* C, std::int64_t ldc,
          GemmPath path = GemmPath::automatic);

}  // namespace tapegrad

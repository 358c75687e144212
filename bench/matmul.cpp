// (c) Matrix product throughput, f32 and f64, forward only: GFLOP/s = 2·M·N·K / median time. Four ways:
// tapegrad's matmul under NoGradGuard (it allocates its output each call), tapegrad's gemm forced onto its Eigen
// path, Eigen's Tensor contraction on tapegrad's thread pool, and cblas_?gemm called directly (these three write a
// preallocated output). The small sizes show where `blas_min_work` should sit.
#include "bench.hpp"
#include "tapegrad/ops/detail/gemm.hpp"
#include "tapegrad/tapegrad.hpp"
#include "tapegrad/tensor/eigen.hpp"

#ifdef TAPEGRAD_HAVE_CBLAS
#include <cblas.h>
#endif

namespace bench {

namespace {

using namespace tapegrad;

#ifdef TAPEGRAD_HAVE_CBLAS
void blas(int M, int N, int K, const float* A, const float* B, float* C) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.f, A, K, B, N, 0.f, C, N);
}
void blas(int M, int N, int K, const double* A, const double* B, double* C) {
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0, A, K, B, N, 0.0, C, N);
}
#endif

template <class T> void product(std::int64_t M, std::int64_t K, std::int64_t N) {
  const Tensor<T> A = randn<T>({M, K}, 21), B = randn<T>({K, N}, 22);
  Tensor<T> C({M, N});
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  const ConstTensorView<T, 2> a(A.data(), M, K), b(B.data(), K, N);
  TensorView<T, 2> c(C.data(), M, N);
  const std::array<Eigen::IndexPair<Eigen::Index>, 1> axes{{{1, 0}}};
  std::vector<const char*> impls{"tapegrad_matmul", "tapegrad_gemm_eigen_path", "eigen_contraction"};
  std::vector<Body> bodies{
      {[&] {
         NoGradGuard no_grad;
         matmul(constant(A), constant(B));
       }},
      {[&] {
         gemm<T>(Transpose::no, Transpose::no, M, N, K, T(1), A.data(), K, B.data(), N, T(0), C.data(), N,
                 GemmPath::eigen);
       }},
      {[&] { c.device(cpu_pool()) = a.contract(b, axes); }},
  };
#ifdef TAPEGRAD_HAVE_CBLAS
  impls.push_back("openblas");
  bodies.push_back({[&] { blas(int(M), int(N), int(K), A.data(), B.data(), C.data()); }});
#endif
  const std::vector<Timing> timings = measure(bodies);
  const double openblas_gflops = impls.size() > 3 ? flops / timings.back().median_ns : 0;
  for (std::size_t k = 0; k < timings.size(); ++k) {
    const double gflops = flops / timings[k].median_ns;
    JsonLine line("matmul");
    line.str("impl", impls[k]).shape({M, K}, "a").shape({K, N}, "b").str("dtype", dtype_name(dtype_v<T>));
    line.timing(timings[k]).num("median_ms", timings[k].median_ns / 1e6).num("gflops", gflops);
    if (openblas_gflops > 0) line.num("vs_openblas", gflops / openblas_gflops);
  }
}

}  // namespace

void matmul() {
  for (std::int64_t n : {16, 32, 64, 128, 256, 512, 1024, 2048}) {
    product<float>(n, n, n);
    product<double>(n, n, n);
  }
  // A transformer MLP's first projection: 2048 tokens, 768 → 3072.
  product<float>(2048, 768, 3072);
  product<double>(2048, 768, 3072);
}

}  // namespace bench

// cuBLASLt's candidates for the six GEMMs of a layernorm_mlp step (bf16 in and out, f32 accumulation), each timed: in
// tapegrad's layouts (ops/layernorm_mlp/gpu_steps.cpp) and in PyTorch's (weights [out, in], as peer_bench.py's
// gemm_floor). For each problem: the heuristic's first choice, then the three fastest candidates with their tile,
// stages and split-K. Plain cuBLASLt, no tapegrad code: it tells what the library could reach by choosing algorithms
// (docs/layernorm_mlp.md). dW2 also runs with db2 = Σ_rows dy summed by the GEMM's epilogue (BGRADA on tapegrad's
// layout, where dy is cuBLASLt's A; BGRADB on PyTorch's), the fusion issue 5 names: its time beside the plain product's
// says what the fused bias gradient costs (tapegrad sums db2 in a separate two-pass reduction). Where H or F is no
// multiple of 8, tapegrad pads every operand and crops y, dW2 and dW1 afterwards with a copy each: those three also run
// padded, and writing only the unpadded part straight into the cropped output (whose rows are then not 16-byte
// aligned), which says whether cuBLASLt keeps its fast kernels for such an output.
//   gemm_candidates [M H F] (default 8192 4096 16384)
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace {

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("gemm_candidates: ") + what + " failed");
}
void check_cuda(cudaError_t e, const char* what) { check(e == cudaSuccess, what); }
void check_blas(cublasStatus_t s, const char* what) { check(s == CUBLAS_STATUS_SUCCESS, what); }

// Values in [-1.5, 1.5) from a hash of the index: GEMM power (and so its clock) depends on the bits it multiplies.
__global__ void fill(__nv_bfloat16* p, size_t n, unsigned long long seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    unsigned long long h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    p[i] = __float2bfloat16((static_cast<float>(h >> 40) / float(1 << 24) - 0.5f) * 3.0f);
  }
}

// A column-major problem D [m, n] = op(A) · op(B), as cuBLASLt sees it, and its epilogue (a bias gradient: the sums
// over k of A's rows (BGRADA, m values) or B's columns (BGRADB, n values), written in bf16 to the bias buffer), and
// the leading dimensions (0: the stored rows).
struct Problem {
  const char* name;
  bool transpose_a, transpose_b;
  long long m, n, k;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  long long lda = 0, ldb = 0, ldd = 0;
};

int config_value(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute) {
  int value = 0;
  size_t written = 0;
  check_blas(cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &value, sizeof value, &written), "config");
  return value;
}

struct Buffers {
  __nv_bfloat16 *a, *b, *d, *bias;
  void* workspace;
  size_t workspace_bytes;
};

void time_candidates(cublasLtHandle_t handle, const Problem& p, const Buffers& buf) {
  constexpr int wanted = 16, runs = 10;
  cublasLtMatmulDesc_t desc;
  check_blas(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  const cublasOperation_t ta = p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_blas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "transa");
  check_blas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "transb");
  if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    check_blas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue, sizeof p.epilogue),
               "epilogue");
    check_blas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &buf.bias, sizeof buf.bias),
               "bias pointer");
  }
  cublasLtMatrixLayout_t la, lb, ld;
  const long long a_rows = p.transpose_a ? p.k : p.m, b_rows = p.transpose_b ? p.n : p.k;
  const auto or_rows = [](long long ld, long long rows) { return ld != 0 ? ld : rows; };
  check_blas(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, a_rows, p.transpose_a ? p.m : p.k, or_rows(p.lda, a_rows)),
             "layout a");
  check_blas(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, b_rows, p.transpose_b ? p.k : p.n, or_rows(p.ldb, b_rows)),
             "layout b");
  check_blas(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, p.m, p.n, or_rows(p.ldd, p.m)), "layout d");
  cublasLtMatmulPreference_t preference;
  check_blas(cublasLtMatmulPreferenceCreate(&preference), "preference");
  const uint64_t workspace = buf.workspace_bytes;
  check_blas(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                  sizeof workspace),
             "workspace");
  cublasLtMatmulHeuristicResult_t found[wanted] = {};  // (std::vector here crashes nvcc 13.0's front end)
  int count = 0;
  const cublasStatus_t heuristic =
      cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, preference, wanted, found, &count);
  if (heuristic != CUBLAS_STATUS_SUCCESS || count == 0) count = 0;  // an epilogue may have no algorithm here
  const float alpha = 1.0f, beta = 0.0f;
  const double flops = 2.0 * double(p.m) * double(p.n) * double(p.k);
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "event");
  check_cuda(cudaEventCreate(&stop), "event");
  struct Timed {
    float ms;
    int index;
  };
  Timed timed[wanted];
  int timed_count = 0;
  for (int i = 0; i < count; ++i) {
    const auto run = [&] {
      return cublasLtMatmul(handle, desc, &alpha, buf.a, la, buf.b, lb, &beta, buf.d, ld, buf.d, ld, &found[i].algo,
                            buf.workspace, buf.workspace_bytes, nullptr);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // a candidate may refuse; the others still count
    for (int w = 0; w < 3; ++w) check_blas(run(), "warm-up");
    check_cuda(cudaEventRecord(start), "record");
    for (int r = 0; r < runs; ++r) check_blas(run(), "matmul");
    check_cuda(cudaEventRecord(stop), "record");
    check_cuda(cudaEventSynchronize(stop), "synchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    timed[timed_count++] = {ms / runs, i};
  }
  if (timed_count == 0) {
    std::printf("%-28s m=%lld n=%lld k=%lld: no algorithm ran (heuristic status %d)\n", p.name, p.m, p.n, p.k,
                static_cast<int>(heuristic));
  } else {
    std::printf("%-28s m=%lld n=%lld k=%lld: %d candidates; first %.3f ms (%.0f TFLOP/s)", p.name, p.m, p.n, p.k,
                count, timed[0].ms, flops / timed[0].ms * 1e-9);
    std::sort(timed, timed + timed_count, [](const Timed& x, const Timed& y) { return x.ms < y.ms; });
    for (int j = 0; j < std::min(3, timed_count); ++j) {
      const cublasLtMatmulAlgo_t& algo = found[timed[j].index].algo;
      std::printf(" | #%d %.3f ms %.0f TFLOP/s tile %d stages %d split-k %d", timed[j].index, timed[j].ms,
                  flops / timed[j].ms * 1e-9, config_value(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                  config_value(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                  config_value(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM));
    }
    std::printf("\n");
  }
  check_cuda(cudaEventDestroy(start), "event");
  check_cuda(cudaEventDestroy(stop), "event");
  cublasLtMatmulPreferenceDestroy(preference);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
}

}  // namespace

int main(int argc, char** argv) try {
  const long long M = argc > 3 ? std::atoll(argv[1]) : 8192, H = argc > 3 ? std::atoll(argv[2]) : 4096,
                  F = argc > 3 ? std::atoll(argv[3]) : 16384;
  cublasLtHandle_t handle;
  check_blas(cublasLtCreate(&handle), "handle");
  const auto padded = [](long long n) { return (n + 7) / 8 * 8; };
  const long long Hp = padded(H), Fp = padded(F);
  const size_t elements = size_t(std::max({M * Fp, Hp * Fp, M * Hp}));
  Buffers buf{nullptr, nullptr, nullptr, nullptr, nullptr, size_t{32} << 20};
  check_cuda(cudaMalloc(&buf.a, elements * 2), "malloc");
  check_cuda(cudaMalloc(&buf.b, elements * 2), "malloc");
  check_cuda(cudaMalloc(&buf.d, elements * 2), "malloc");
  check_cuda(cudaMalloc(&buf.bias, size_t(std::max(H, F)) * 2), "malloc");
  check_cuda(cudaMalloc(&buf.workspace, buf.workspace_bytes), "malloc");
  fill<<<1024, 256>>>(buf.a, elements, 1);
  fill<<<1024, 256>>>(buf.b, elements, 2);
  check_cuda(cudaGetLastError(), "fill");
  // Row-major out [r, c] = X · Y is column-major outᵀ [c, r] = Yᵀ · Xᵀ: cuBLASLt's A is the right-hand operand.
  const Problem problems[] = {
      {"z = h W1 (tapegrad)", false, false, F, M, H},     {"z = h w1^T (torch)", true, false, F, M, H},
      {"y = a W2 (tapegrad)", false, false, H, M, F},     {"y = a w2^T (torch)", true, false, H, M, F},
      {"dW2 = a^T dy (tapegrad)", false, true, H, F, M},  {"dw2 = dy^T a (torch)", false, true, F, H, M},
      {"dW2, db2 (tapegrad, BGRADA)", false, true, H, F, M, CUBLASLT_EPILOGUE_BGRADA},
      {"dw2, db2 (torch, BGRADB)", false, true, F, H, M, CUBLASLT_EPILOGUE_BGRADB},
      {"da = dy W2^T (tapegrad)", true, false, F, M, H},  {"da = dy w2 (torch)", false, false, F, M, H},
      {"dW1 = h^T dz (tapegrad)", false, true, F, H, M},  {"dw1 = dz^T h (torch)", false, true, H, F, M},
      {"dh = dz W1^T (tapegrad)", true, false, H, M, F},  {"dh = dz w1 (torch)", false, false, H, M, F},
  };
  for (const Problem& p : problems) time_candidates(handle, p, buf);
  constexpr cublasLtEpilogue_t plain = CUBLASLT_EPILOGUE_DEFAULT;
  const Problem padded_problems[] = {
      {"y, padded", false, false, Hp, M, Fp},
      {"y, cropped output", false, false, H, M, Fp, plain, Hp, Fp, H},
      {"dW2, padded", false, true, Hp, Fp, M},
      {"dW2, cropped output", false, true, H, F, M, plain, Hp, Fp, H},
      {"dW1, padded", false, true, Fp, Hp, M},
      {"dW1, cropped output", false, true, F, H, M, plain, Fp, Hp, F},
  };
  if (Hp != H || Fp != F) {
    for (const Problem& p : padded_problems) time_candidates(handle, p, buf);
  }
  check_cuda(cudaFree(buf.a), "free");
  check_cuda(cudaFree(buf.b), "free");
  check_cuda(cudaFree(buf.d), "free");
  check_cuda(cudaFree(buf.bias), "free");
  check_cuda(cudaFree(buf.workspace), "free");
  check_blas(cublasLtDestroy(handle), "destroy");
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}

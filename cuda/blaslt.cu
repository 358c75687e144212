// cuBLASLt GEMM (see blaslt.hpp).
//
// Row-major without copies: cuBLASLt's matrices are column-major, and a row-major [r, c] matrix with rows ld apart
// is, read column-major, the [c, r] matrix with columns ld apart: its transpose. So C = op(A) · op(B) is computed as
// Cᵀ = op(B)ᵀ · op(A)ᵀ: cuBLASLt's first operand is our B, its second our A, each keeping its transpose flag, and
// its [N, M] column-major output is our C. Its bias epilogue adds bias[j] along row j of that [N, M] output, which
// is column j of C: a bias broadcast over C's rows.
//
// Split-K: only algorithms that add partial sums in the compute type (or do not split) are allowed; cuBLASLt's
// other schemes add them in the output type, which for bf16/f16 would round more than once.
// K == 0 is no cuBLASLt problem (an [M, 0] operand has no valid layout): a small kernel writes beta · C + bias.
#include "tapegrad/cuda/blaslt.hpp"

#include <cublasLt.h>

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "tapegrad/cuda/cublas_check.cuh"
#include "tapegrad/cuda/detail/activation_math.hpp"
#include "tapegrad/tensor/core/fp8.hpp"
#include "tapegrad/tensor/gpu/detail/launch.cuh"

namespace tapegrad::cuda {

namespace {

// The most workspace an algorithm may ask for: what NVIDIA recommends on Hopper for its largest kernels.
constexpr std::uint64_t max_workspace_bytes = std::uint64_t{32} << 20;

std::atomic<bool> tf32_allowed{false};
std::atomic<bool> autotune_enabled{false};

// How many of cuBLASLt's candidates autotuning times, in how many rounds of how many runs each. Rounds visit every
// candidate in turn and each keeps its fastest round: a GPU's clock falls as it warms, and timing candidates one
// after another would favour the first ones.
constexpr int tuning_candidates = 8;
constexpr int tuning_rounds = 3;
constexpr int tuning_runs = 3;

// A matrix's extent as stored, [rows, cols].
struct Extent {
  std::int64_t rows, cols;
};
Extent stored_a(const GemmArgs& g) { return g.a.transpose ? Extent{g.K, g.M} : Extent{g.M, g.K}; }
Extent stored_b(const GemmArgs& g) { return g.b.transpose ? Extent{g.N, g.K} : Extent{g.K, g.N}; }

// C's dtype as written: the inputs', their compute type when wide, or fp8 codes.
DType output_dtype(const GemmArgs& g) {
  if (g.fp8 && g.fp8->c_codes) return *g.fp8->c_codes;
  return g.wide_output ? compute_dtype(g.dtype) : g.dtype;
}
bool writes_codes(const GemmArgs& g) { return g.fp8 && g.fp8->c_codes; }
// The operands' dtypes as stored.
DType a_dtype(const GemmArgs& g) { return g.fp8 ? g.fp8->a : g.dtype; }
DType b_dtype(const GemmArgs& g) { return g.fp8 ? g.fp8->b : g.dtype; }

const char* scaling_name(Fp8Scaling scaling) {
  switch (scaling) {
    case Fp8Scaling::tiles_1x128: return " (1x128 tiles)";
    case Fp8Scaling::blocks_128x128: return " (128x128 blocks)";
    default: return "";
  }
}

// The problem in words, formatted only where it is printed: check() and TAPEGRAD_CUBLAS_CHECK print it on failure
// alone (formatted on every call, it cost a small layernorm_mlp step about a fifth of its host time).
struct Described {
  const GemmArgs& g;
};
Described describe(const GemmArgs& g) { return {g}; }

std::ostream& operator<<(std::ostream& out, const Described& d) {
  const GemmArgs& g = d.g;
  const Extent a = stored_a(g), b = stored_b(g);
  if (g.fp8) {
    out << dtype_name(g.fp8->a) << scaling_name(g.fp8->a_scaling) << " × " << dtype_name(g.fp8->b)
        << scaling_name(g.fp8->b_scaling) << " to ";
  }
  return out << dtype_name(g.dtype)
             << (writes_codes(g)                ? " (as fp8 codes)"
                 : output_dtype(g) != g.dtype ? " (f32 output)"
                                              : "")
             << " gemm of op(A) ["
             << g.M << ", " << g.K << "] and op(B) [" << g.K << ", " << g.N << "], batch " << g.batch
             << ": A stored [" << a.rows << ", " << a.cols << "]" << (g.a.transpose ? " (transposed)" : "")
             << " with lda " << g.a.ld << " and batch stride " << g.a.batch_stride << ", B stored [" << b.rows
             << ", " << b.cols << "]" << (g.b.transpose ? " (transposed)" : "") << " with ldb " << g.b.ld
             << " and batch stride " << g.b.batch_stride << ", C [" << g.M << ", " << g.N << "] with ldc "
             << g.c.ld << " and batch stride " << g.c.batch_stride << (g.bias ? ", plus a bias" : "")
             << (g.gelu_input ? ", then GELU" : "") << (g.dgelu_input ? ", times GELU's derivative" : "")
             << (g.bias_gradient ? " (and its column sums)" : "");
}

cudaDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDA_R_32F;
    case DType::f64: return CUDA_R_64F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    case DType::f8e4m3: return CUDA_R_8F_E4M3;
    case DType::f8e5m2: return CUDA_R_8F_E5M2;
    default: check(false, "gemm", "no GPU GEMM for dtype ", dtype_name(dtype));
  }
  return CUDA_R_32F;  // not reached
}

// An fp8 product's operands as Hopper's FP8 kernels take them (see GemmFp8).
void validate_fp8(const GemmArgs& g) {
  const GemmFp8& f = *g.fp8;
  check(is_fp8(f.a) && is_fp8(f.b) && !(f.a == DType::f8e5m2 && f.b == DType::f8e5m2), "gemm",
        "fp8 operands are f8e4m3 or f8e5m2, not both f8e5m2: the ", describe(g));
  check(f.a_scale_inv && f.b_scale_inv, "gemm", "fp8 operands need their scale_inv pointers: the ", describe(g));
  // (cuBLASLt refuses the product when run with a scale pointer that is not.)
  check(aligned_16(f.a_scale_inv) && aligned_16(f.b_scale_inv), "gemm",
        "fp8 operands' scale_inv pointers must be 16-byte aligned: the ", describe(g));
  const bool tiled = f.a_scaling != Fp8Scaling::tensor || f.b_scaling != Fp8Scaling::tensor;
  check(!(f.a_scaling == Fp8Scaling::blocks_128x128 && f.b_scaling == Fp8Scaling::blocks_128x128), "gemm",
        "Hopper's block-scaled FP8 kernels take at most one operand in 128x128 blocks: the ", describe(g));
  check(!tiled || (!f.fast_accumulation && !g.bias), "gemm",
        "block-scaled fp8 operands take neither fast accumulation nor a bias: the ", describe(g));
  // (cuBLASLt reads 1×128 scales in rows of exactly the operand's rows, which TMA needs 16-byte aligned, and refuses
  // other sizes; it refuses K = 200, and for K = 16 returned wrong sums with beta = 1: measured on an H200, CUDA 13.)
  check((f.a_scaling != Fp8Scaling::tiles_1x128 || g.M % 4 == 0) &&
            (f.b_scaling != Fp8Scaling::tiles_1x128 || g.N % 4 == 0),
        "gemm", "an operand in 1x128 tiles needs its rows (M for A, N for B) a multiple of 4: the ", describe(g));
  check(!tiled || g.K % fp8::block_tile == 0, "gemm", "block-scaled fp8 operands need K a multiple of ", fp8::block_tile,
        ": the ", describe(g));
  // (cuBLASLt's FP8 kernels misread an f32 bias: measured wrong on an H200 with CUDA 13.)
  check(!g.bias || g.dtype != DType::f32, "gemm", "an fp8 product adds a bias only to a bf16 or f16 output: the ",
        describe(g));
  check(!g.a.transpose && g.b.transpose, "gemm",
        "FP8 kernels read both operands along K: A stored [M, K] and B stored [N, K] (transposed), not the ",
        describe(g));
  check(g.dtype != DType::f64 && !g.wide_output && g.batch == 1 && !g.dgelu_input && (!g.gelu_input || f.c_codes),
        "gemm", "an fp8 product writes bf16, f16 or f32 (or codes after GELU), one product, no GELU derivative: the ",
        describe(g));
  // (the codes' C takes the epilogue's input as its unread C: beta 0)
  check(!f.c_codes || (is_fp8(*f.c_codes) && g.gelu_input && f.c_scale && !tiled && g.beta == 0.0 && g.K > 0 &&
                       g.dtype != DType::f32 && g.c.ld % fp8_row_alignment == 0),
        "gemm", "fp8 codes as C need the GELU epilogue, a scale, per-tensor scales, beta 0, K > 0, a bf16 or f16 ",
        "epilogue input and rows a multiple of 16 apart: the ", describe(g));
}

void validate(const GemmArgs& g) {
  check(!is_fp8(g.dtype), "gemm", "C's dtype ", dtype_name(g.dtype), " is not a float dtype for a GEMM's output");
  data_type(g.dtype);
  if (g.fp8) validate_fp8(g);
  check(g.M >= 0 && g.N >= 0 && g.K >= 0 && g.batch >= 0, "gemm", "negative size in the ", describe(g));
  check(g.batch <= INT32_MAX, "gemm", "a batch of more than 2^31 - 1 entries in the ", describe(g));
  // (cuBLASLt only sees products with M, N and K all positive, so these leading dimensions are positive too.)
  const Extent a = stored_a(g), b = stored_b(g);
  check(g.a.ld >= a.cols && g.b.ld >= b.cols && g.c.ld >= g.N, "gemm",
        "a leading dimension is shorter than its matrix's rows in the ", describe(g));
  check(g.a.batch_stride >= 0 && g.b.batch_stride >= 0, "gemm", "negative batch stride in the ", describe(g));
  check(g.batch <= 1 || g.M == 0 || g.c.batch_stride >= (g.M - 1) * g.c.ld + g.N, "gemm",
        "the output matrices overlap in the ", describe(g));
  check(!g.gelu_input || (g.bias && g.batch == 1 && !g.wide_output && g.dtype != DType::f64 && g.c.ld % 8 == 0),
        "gemm", "the GELU epilogue needs a bias, one product, a bf16, f16 or f32 output and an ldc that is a ",
        "multiple of 8: the ", describe(g));
  check(!g.dgelu_input || (!g.bias && !g.gelu_input && g.beta == 0.0 && g.batch == 1 && !g.wide_output &&
                           g.dtype != DType::f64 && g.c.ld % 8 == 0),
        "gemm", "the GELU-derivative epilogue needs no bias, beta 0, one product, a bf16, f16 or f32 output and an ",
        "ldc that is a multiple of 8: the ", describe(g));
  check(!g.bias_gradient || g.dgelu_input, "gemm", "a bias gradient comes only with the GELU-derivative epilogue: the ",
        describe(g));
  check(!g.addend || !writes_codes(g), "gemm",
        "an addend takes the place of C, which fp8 codes as C leave unread: the ", describe(g));
}

// The batch stride cuBLASLt sees: none for a single product.
std::int64_t stride_of(std::int64_t batch_stride, const GemmArgs& g) { return g.batch > 1 ? batch_stride : 0; }

// The largest power of two, at most 256, dividing the byte address of every matrix of a stack: cuBLASLt only picks
// algorithms whose vector loads that alignment allows.
std::uint32_t alignment(const void* data, std::int64_t batch_stride, DType dtype) {
  const std::uint64_t bits = reinterpret_cast<std::uintptr_t>(data) |
                             static_cast<std::uint64_t>(batch_stride) * dtype_size(dtype) | std::uint64_t{256};
  return static_cast<std::uint32_t>(bits & (~bits + 1));
}

// The one cuBLASLt handle of each device, created on first use (thread-safe) and never destroyed: work queued with
// it may outlive main, like the tensors it reads.
cublasLtHandle_t handle_of(int device) {
  static std::vector<std::once_flag> ready(static_cast<std::size_t>(device_count()));
  static std::vector<cublasLtHandle_t> handles(static_cast<std::size_t>(device_count()));
  const auto i = static_cast<std::size_t>(device);
  std::call_once(ready[i], [&] {
    OnDevice on(device);
    TAPEGRAD_CUBLAS_CHECK(cublasLtCreate(&handles[i]), detail::concat("the handle of cuda:", device));
  });
  return handles[i];
}

// Attribute setters, one per kind of descriptor.
template <class V>
void set(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attribute, const V& value,
         const GemmArgs& g) {
  TAPEGRAD_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, attribute, &value, sizeof(value)),
                        detail::concat("the ", describe(g), " (layout attribute ", attribute, ")"));
}
template <class V>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const V& value, const GemmArgs& g) {
  TAPEGRAD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)),
                        detail::concat("the ", describe(g), " (matmul attribute ", attribute, ")"));
}
template <class V>
void set(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute, const V& value,
         const GemmArgs& g) {
  TAPEGRAD_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)),
                        detail::concat("the ", describe(g), " (preference attribute ", attribute, ")"));
}

// cuBLASLt's view of the problem (see the top of the file). The descriptors live in place: nothing to destroy.
struct Problem {
  cublasLtMatmulDescOpaque_t matmul;
  cublasLtMatrixLayoutOpaque_t first;   // our B
  cublasLtMatrixLayoutOpaque_t second;  // our A
  cublasLtMatrixLayoutOpaque_t out;     // our C, read (beta != 0) and written
  cublasLtMatrixLayoutOpaque_t values;  // with C as codes: cuBLASLt's C in dtype (beta 0: never read)
};

// A row-major stack as a column-major layout: the stored [rows, cols] read as [cols, rows].
void init_layout(cublasLtMatrixLayoutOpaque_t& layout, DType dtype, Extent e, std::int64_t ld,
                 std::int64_t batch_stride, const GemmArgs& g) {
  TAPEGRAD_CUBLAS_CHECK(cublasLtMatrixLayoutInit(&layout, data_type(dtype), static_cast<std::uint64_t>(e.cols),
                                                 static_cast<std::uint64_t>(e.rows), ld),
                        describe(g));
  if (g.batch > 1) {
    set(&layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<std::int32_t>(g.batch), g);
    set(&layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, batch_stride, g);
  }
}

cublasOperation_t operation(bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }

std::int32_t scale_mode(Fp8Scaling scaling) {
  switch (scaling) {
    case Fp8Scaling::tiles_1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case Fp8Scaling::blocks_128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    default: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  }
}

cublasLtEpilogue_t epilogue_of(const GemmArgs& g) {
  if (g.dgelu_input) return g.bias_gradient ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
  if (g.gelu_input) return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  return g.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

void init_problem(Problem& p, const GemmArgs& g, bool tf32) {
  const cublasComputeType_t compute = g.dtype == DType::f64 ? CUBLAS_COMPUTE_64F
                                      : tf32                ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                            : CUBLAS_COMPUTE_32F;
  const cudaDataType_t scale = g.dtype == DType::f64 ? CUDA_R_64F : CUDA_R_32F;
  TAPEGRAD_CUBLAS_CHECK(cublasLtMatmulDescInit(&p.matmul, compute, scale), describe(g));
  set(&p.matmul, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<std::int32_t>(operation(g.b.transpose)), g);
  set(&p.matmul, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<std::int32_t>(operation(g.a.transpose)), g);
  if (g.bias || g.dgelu_input) {
    set(&p.matmul, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<std::uint32_t>(epilogue_of(g)), g);
  }
  // The bias (one vector for every entry: batch stride 0), or the bias gradient's output.
  if (g.bias) set(&p.matmul, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias, g);
  if (g.bias_gradient) set(&p.matmul, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias_gradient, g);
  if (const void* aux = g.gelu_input ? g.gelu_input : g.dgelu_input) {  // GELU's input, laid out as C
    set(&p.matmul, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux, g);
    set(&p.matmul, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.c.ld, g);
  }
  if (g.fp8) {  // cuBLASLt's A is our B
    set(&p.matmul, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, g.fp8->b_scale_inv, g);
    set(&p.matmul, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, g.fp8->a_scale_inv, g);
    set(&p.matmul, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<std::int8_t>(g.fp8->fast_accumulation), g);
    if (g.fp8->a_scaling != Fp8Scaling::tensor || g.fp8->b_scaling != Fp8Scaling::tensor) {
      set(&p.matmul, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, scale_mode(g.fp8->b_scaling), g);
      set(&p.matmul, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, scale_mode(g.fp8->a_scaling), g);
    }
  }
  if (writes_codes(g)) {  // (the bias and the epilogue's input would otherwise take the codes' type)
    set(&p.matmul, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, g.fp8->c_scale, g);
    if (g.fp8->c_amax) set(&p.matmul, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, g.fp8->c_amax, g);
    set(&p.matmul, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(data_type(g.dtype)), g);
    set(&p.matmul, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, static_cast<std::int32_t>(data_type(g.dtype)), g);
    init_layout(p.values, g.dtype, {g.M, g.N}, g.c.ld, 0, g);
  }
  init_layout(p.first, b_dtype(g), stored_b(g), g.b.ld, stride_of(g.b.batch_stride, g), g);
  init_layout(p.second, a_dtype(g), stored_a(g), g.a.ld, stride_of(g.a.batch_stride, g), g);
  init_layout(p.out, output_dtype(g), {g.M, g.N}, g.c.ld, stride_of(g.c.batch_stride, g), g);
}

// Everything the choice of algorithm depends on.
struct AlgoKey {
  int device;
  DType dtype, output, a_dtype, b_dtype;
  bool tf32, tuned, fast_accumulation, trans_a, trans_b;
  Fp8Scaling a_scaling, b_scaling;
  std::uint32_t epilogue;
  std::int64_t M, N, K, batch, lda, ldb, ldc, stride_a, stride_b, stride_c;
  std::uint32_t align_a, align_b, align_c, align_addend, align_bias, align_aux;
  auto operator<=>(const AlgoKey&) const = default;
};

AlgoKey key_of(const GemmArgs& g, int device, bool tf32, bool tuned) {
  const std::int64_t sa = stride_of(g.a.batch_stride, g), sb = stride_of(g.b.batch_stride, g),
                     sc = stride_of(g.c.batch_stride, g);
  return {device,
          g.dtype,
          output_dtype(g),
          a_dtype(g),
          b_dtype(g),
          tf32,
          tuned,
          g.fp8 && g.fp8->fast_accumulation,
          g.a.transpose,
          g.b.transpose,
          g.fp8 ? g.fp8->a_scaling : Fp8Scaling::tensor,
          g.fp8 ? g.fp8->b_scaling : Fp8Scaling::tensor,
          static_cast<std::uint32_t>(epilogue_of(g)),
          g.M,
          g.N,
          g.K,
          g.batch,
          g.a.ld,
          g.b.ld,
          g.c.ld,
          sa,
          sb,
          sc,
          alignment(g.a.data, sa, a_dtype(g)),
          alignment(g.b.data, sb, b_dtype(g)),
          alignment(g.c.data, sc, output_dtype(g)),
          alignment(g.addend ? g.addend : g.c.data, sc, output_dtype(g)),
          alignment(g.bias ? g.bias : g.bias_gradient, 0, output_dtype(g)),
          alignment(g.gelu_input ? g.gelu_input : g.dgelu_input, 0, output_dtype(g))};
}

struct Algo {
  cublasLtMatmulAlgo_t algo;
  std::size_t workspace_bytes;
};

// alpha and beta in the scale type cuBLASLt expects (f64 for f64, f32 otherwise).
struct Scalars {
  double f64[2];
  float f32[2];
  bool wide;
  Scalars(const GemmArgs& g, double beta)
      : f64{g.alpha, beta}, f32{static_cast<float>(g.alpha), static_cast<float>(beta)}, wide(g.dtype == DType::f64) {}
  const void* alpha() const { return wide ? static_cast<const void*>(&f64[0]) : &f32[0]; }
  const void* beta() const { return wide ? static_cast<const void*>(&f64[1]) : &f32[1]; }
  bool reads_c() const { return f64[1] != 0.0; }
};

// cuBLASLt's C: our C, or, where C is written as codes, the values layout at the epilogue's input (beta 0).
cublasLtMatrixLayoutOpaque_t* c_layout(Problem& p, const GemmArgs& g) {
  return writes_codes(g) ? &p.values : &p.out;
}

// D = alpha · op(A) · op(B) + beta · C (+ bias) with the given algorithm, D at `out` (and C too, unless written as
// codes or read from an addend); the status, unchecked.
cublasStatus_t run_matmul(cublasLtHandle_t handle, Problem& p, const GemmArgs& g, const Scalars& scalars,
                          const cublasLtMatmulAlgo_t& algo, void* out, const Scratch& workspace,
                          cudaStream_t stream) {
  const void* c = writes_codes(g) ? g.gelu_input : g.addend && scalars.reads_c() ? g.addend : out;
  return cublasLtMatmul(handle, &p.matmul, scalars.alpha(), g.b.data, &p.first, g.a.data, &p.second, scalars.beta(),
                        c, c_layout(p, g), out, &p.out, &algo, workspace.data(), workspace.bytes(), stream);
}

// cuBLASLt's candidates for the problem, best first by its heuristic: at least one, at most `count`.
struct Candidates {
  std::array<Algo, tuning_candidates> algos;
  int count;
};
Candidates candidates(cublasLtHandle_t handle, Problem& p, const GemmArgs& g, const AlgoKey& key, int count) {
  cublasLtMatmulPreferenceOpaque_t preference;
  TAPEGRAD_CUBLAS_CHECK(cublasLtMatmulPreferenceInit(&preference), describe(g));
  set(&preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_workspace_bytes, g);
  set(&preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
      static_cast<std::uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE), g);
  set(&preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b, g);  // cuBLASLt's A is our B
  set(&preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a, g);
  set(&preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, writes_codes(g) ? key.align_aux : key.align_addend, g);
  set(&preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c, g);
  cublasLtMatmulHeuristicResult_t results[tuning_candidates] = {};
  int found = 0;
  TAPEGRAD_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, &p.matmul, &p.first, &p.second, c_layout(p, g), &p.out,
                                                       &preference, std::min(count, tuning_candidates), results,
                                                       &found),
                        describe(g));
  check(found > 0, "gemm", "cuBLASLt has no algorithm for the ", describe(g));
  Candidates c{{}, found};
  for (int i = 0; i < found; ++i) c.algos[static_cast<std::size_t>(i)] = {results[i].algo, results[i].workspaceSize};
  return c;
}

// The elements C's stack spans, from its first element to its last.
std::int64_t output_span(const GemmArgs& g) {
  return (g.batch > 1 ? (g.batch - 1) * g.c.batch_stride : 0) + (g.M - 1) * g.c.ld + g.N;
}

// Reads `words` 16-byte words, pushing whatever L2 held before out of it (the empty asm keeps the loads).
__global__ void evict_kernel(const int4* data, std::int64_t words) {
  int folded = 0;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < words;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const int4 v = data[i];
    folded ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  asm volatile("" : : "r"(folded));
}

// Twice the device's L2, read before each timed run: a product in a training step mostly finds its operands in
// memory, not in L2, and kernels with few pipeline stages that win on operands still in L2 from the run before lose
// there (at (4096, 1024, 4096) 512 × 64 tiles of two stages were kept and then ran 72 µs in the step where the
// heuristic's choice ran 45).
class L2Evictor {
 public:
  explicit L2Evictor(const Launch& launch)
      : launch_(launch), buffer_(2 * static_cast<std::size_t>(l2_cache_bytes(launch.device())), launch.device()) {}
  void evict() const {
    constexpr int threads = 512;
    const auto words = static_cast<std::int64_t>(buffer_.bytes() / sizeof(int4));
    evict_kernel<<<launch_.blocks_for(words, threads), threads, 0, launch_.stream()>>>(
        static_cast<const int4*>(buffer_.data()), words);
    TAPEGRAD_CUDA_CHECK_LAUNCH();
  }

 private:
  const Launch& launch_;
  Scratch buffer_;
};

// Milliseconds per run of `algo` on the problem's inputs (into `out`, beta 0), each run timed alone after L2 was
// evicted, or a negative value where cuBLASLt refuses to run it.
float time_candidate(cublasLtHandle_t handle, Problem& p, const GemmArgs& g, const Algo& algo, void* out,
                     const L2Evictor& evictor, const Launch& launch) {
  const cudaStream_t stream = launch.stream();
  const Scratch workspace(algo.workspace_bytes, launch.device());
  const Scalars scalars(g, 0.0);
  if (run_matmul(handle, p, g, scalars, algo.algo, out, workspace, stream) != CUBLAS_STATUS_SUCCESS) return -1.0f;
  cudaEvent_t events[2];
  for (cudaEvent_t& e : events) TAPEGRAD_CUDA_CHECK(cudaEventCreate(&e));
  float total = 0.0f;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  for (int i = 0; i < tuning_runs && status == CUBLAS_STATUS_SUCCESS; ++i) {
    evictor.evict();
    TAPEGRAD_CUDA_CHECK(cudaEventRecord(events[0], stream));
    status = run_matmul(handle, p, g, scalars, algo.algo, out, workspace, stream);
    TAPEGRAD_CUDA_CHECK(cudaEventRecord(events[1], stream));
    TAPEGRAD_CUDA_CHECK(cudaEventSynchronize(events[1]));
    float ms = 0.0f;
    TAPEGRAD_CUDA_CHECK(cudaEventElapsedTime(&ms, events[0], events[1]));
    total += ms;
  }
  for (cudaEvent_t e : events) TAPEGRAD_CUDA_CHECK(cudaEventDestroy(e));
  return status == CUBLAS_STATUS_SUCCESS ? total / tuning_runs : -1.0f;
}

// The problem's algorithm: cuBLASLt's first choice, or with autotuning the fastest of its first candidates, timed
// on the problem's own inputs into scratch (C is not touched). A stream being captured into a graph cannot wait
// for timings: it gets the first choice.
Algo choose_algorithm(cublasLtHandle_t handle, Problem& p, const GemmArgs& g, const AlgoKey& key,
                      const Launch& launch) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TAPEGRAD_CUDA_CHECK(cudaStreamIsCapturing(launch.stream(), &capture));
  const bool tune = key.tuned && capture == cudaStreamCaptureStatusNone;
  const Candidates found = candidates(handle, p, g, key, tune ? tuning_candidates : 1);
  if (!tune || found.count == 1) return found.algos[0];
  const Scratch out(static_cast<std::size_t>(output_span(g)) * dtype_size(output_dtype(g)), launch.device());
  const L2Evictor evictor(launch);
  const auto count = static_cast<std::size_t>(found.count);
  std::array<float, tuning_candidates> fastest;  // ms per run; negative once refused
  for (int round = 0; round < tuning_rounds; ++round) {
    for (std::size_t i = 0; i < count; ++i) {
      if (round > 0 && fastest[i] < 0.0f) continue;
      const float t = time_candidate(handle, p, g, found.algos[i], out.data(), evictor, launch);
      fastest[i] = round == 0 || t < 0.0f ? t : std::min(fastest[i], t);
    }
  }
  std::size_t best = 0;  // the heuristic's first where every candidate was refused
  for (std::size_t i = 0; i < count; ++i) {
    if (fastest[i] >= 0.0f && (fastest[best] < 0.0f || fastest[i] < fastest[best])) best = i;
  }
  return found.algos[best];
}

// The algorithm of a problem, chosen on its first call. The first choice stored wins, so that every later call
// runs the same algorithm (and gives the same bits).
Algo algorithm(cublasLtHandle_t handle, Problem& p, const GemmArgs& g, const AlgoKey& key, const Launch& launch) {
  static std::mutex mutex;
  static std::map<AlgoKey, Algo> cache;
  {
    const std::lock_guard lock(mutex);
    if (const auto it = cache.find(key); it != cache.end()) return it->second;
  }
  const Algo chosen = choose_algorithm(handle, p, g, key, launch);  // outside the lock: other problems need not wait
  const std::lock_guard lock(mutex);
  return cache.try_emplace(key, chosen).first->second;
}

// C_i = beta · C_i (or the addend's) + bias for every entry: the product over an empty K. beta == 0 does not read C.
// With gelu_input (one entry): the sum there, and its GELU in C, as the epilogue does. (With dgelu_input, beta is 0
// and there is no bias: C = 0 · GELU' = 0.)
template <class S>
__global__ void empty_product_kernel(S* c, const S* c_in, std::int64_t total, std::int64_t M, std::int64_t N,
                                     std::int64_t ld, std::int64_t batch_stride, compute_of<S> beta, const S* bias,
                                     S* gelu_input) {
  using C = compute_of<S>;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t col = i % N, row = i / N;  // row counts over all entries' rows
    const std::int64_t at = (row / M) * batch_stride + (row % M) * ld + col;
    C v = beta == C(0) ? C(0) : beta * to_compute<C>(c_in[at]);
    if (bias != nullptr) v += to_compute<C>(bias[col]);
    if (gelu_input != nullptr) {
      gelu_input[at] = from_compute<S>(v);
      v = activation::gelu_tanh(v, static_cast<C*>(nullptr));
    }
    c[at] = from_compute<S>(v);
  }
}

// An empty product: K == 0 (the kernel above), or M == 0 (nothing to write but a bias gradient). The column sums of
// a zero or empty C are zeros.
void empty_product(const GemmArgs& g, const Launch& launch) {
  if (g.bias_gradient) {
    TAPEGRAD_CUDA_CHECK(cudaMemsetAsync(g.bias_gradient, 0, static_cast<std::size_t>(g.N) * dtype_size(output_dtype(g)),
                                        launch.stream()));
  }
  if (g.M == 0) return;
  dispatch_float(output_dtype(g), "gemm", [&](auto tag) {
    using S = decltype(tag);
    constexpr int threads = 256;
    const std::int64_t total = g.batch * g.M * g.N;
    empty_product_kernel<S><<<launch.blocks_for(total, threads), threads, 0, launch.stream()>>>(
        static_cast<S*>(g.c.data), static_cast<const S*>(g.addend ? g.addend : g.c.data), total, g.M, g.N, g.c.ld,
        g.c.batch_stride, static_cast<compute_of<S>>(g.beta),
        static_cast<const S*>(g.bias), static_cast<S*>(g.gelu_input));
    TAPEGRAD_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

Fp8ScaleShape fp8_scale_shape(Fp8Scaling scaling, std::int64_t outer, std::int64_t K) {
  const auto round_up_4 = [](std::int64_t n) { return (n + 3) / 4 * 4; };
  const auto tiles = [](std::int64_t n) { return (n + fp8::block_tile - 1) / fp8::block_tile; };
  switch (scaling) {
    case Fp8Scaling::tiles_1x128: return {tiles(K), round_up_4(outer)};
    case Fp8Scaling::blocks_128x128: return {tiles(outer), round_up_4(tiles(K))};
    default: return {};
  }
}

void gemm(const GemmArgs& g, int device) {
  check_device_index(device, "gemm");
  validate(g);
  if (g.N == 0 || g.batch == 0) return;
  const Launch launch(device);
  if (g.M == 0 || g.K == 0) return empty_product(g, launch);

  const bool tf32 = g.dtype == DType::f32 && !g.fp8 && allow_tf32();
  const cublasLtHandle_t handle = handle_of(device);
  Problem p;
  init_problem(p, g, tf32);
  const Algo algo = algorithm(handle, p, g, key_of(g, device, tf32, gemm_autotune()), launch);
  const Scratch workspace(algo.workspace_bytes, device);
  TAPEGRAD_CUBLAS_CHECK(run_matmul(handle, p, g, Scalars(g, g.beta), algo.algo, g.c.data, workspace, launch.stream()),
                        describe(g));
}

void set_allow_tf32(bool allow) { tf32_allowed.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return tf32_allowed.load(std::memory_order_relaxed); }

void set_gemm_autotune(bool enable) { autotune_enabled.store(enable, std::memory_order_relaxed); }
bool gemm_autotune() { return autotune_enabled.load(std::memory_order_relaxed); }

}  // namespace tapegrad::cuda

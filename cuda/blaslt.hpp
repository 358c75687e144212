// Matrix products on the GPU through cuBLASLt. Plain C++ (see tensor/gpu/backend.hpp for how ops call it).
//
// C_i = alpha · op(A_i) · op(B_i) + beta · C_i (+ bias)      for every batch entry i < batch
//
// on row-major matrices: op(A_i) is [M, K], stored [M, K] or, transposed, [K, M], its rows `ld` elements apart and
// matrix i starting `i · batch_stride` elements after `data` (batch_stride 0: the same matrix for every entry);
// likewise op(B_i) is [K, N], and C_i is [M, N]. beta == 0 never reads C. K == 0 gives C_i = beta · C_i (+ bias). The
// work is queued on the device's current stream; nothing waits for it.
//
// Precision: f64 multiplies and accumulates in f64. f32 is exact FP32 unless set_allow_tf32(true): then the inputs are
// rounded to TF32 (10-bit mantissa) for the tensor cores, accumulating in f32. bf16/f16 multiply and accumulate in f32
// and round once to the output; split-K partial sums are kept in f32 too. alpha and beta are f32 except for f64. The
// same call on the same device gives bitwise the same result every run.
//
// Cost of a call: the algorithm is chosen once per problem (shapes, dtypes, transposes, batch, strides, pointer
// alignments, bias or not, TF32 or not, autotuned or not) and cached; its workspace, at most 32 MiB and only what the
// chosen algorithm needs, comes from the device's stream-ordered pool on the current stream and goes back after the
// product (the pool caches it, so a repeated call allocates nothing from the driver). One cuBLASLt handle per device,
// created on first use and shared by all threads.
#pragma once

#include <cstdint>
#include <optional>

#include "tapegrad/cuda/settings.hpp"
#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

// One input operand, a stack of matrices as stored.
struct GemmOperand {
  const void* data = nullptr;
  std::int64_t ld = 0;            // elements between rows
  std::int64_t batch_stride = 0;  // elements between the matrices of consecutive entries; 0: one shared matrix
  bool transpose = false;         // stored transposed: op(X) = Xᵀ
};

// The output stack: distinct matrices, rows `ld` apart.
struct GemmOutput {
  void* data = nullptr;
  std::int64_t ld = 0;
  std::int64_t batch_stride = 0;
};

// FP8 operands (Hopper's FP8 tensor cores): A and B hold fp8 codes, each f8e4m3 or f8e5m2 (not both f8e5m2), and
// an operand's values are its codes times its dequantization scale, one f32 on the device at a 16-byte aligned
// address, read when the product runs (TransformerEngine's scale_inv). The kernels read both operands along K: A
// stored [M, K] (not transposed) and B stored [N, K] (transposed). The accumulation is f32; fast_accumulation lets
// the tensor cores keep fewer bits between their partial sums (TransformerEngine's choice for the forward's
// products).
//
// Block scaling (Hopper's block-scaled FP8 kernels) gives an operand stored [outer, K] a scale per tile instead, the
// f32 scales at a 16-byte aligned address, laid out as cuBLASLt reads them (fp8_scale_shape):
//   tiles_1x128 (cuBLASLt's VEC128_32F): elements [o, 128k .. 128k + 128) at index k · round_up(outer, 4) + o;
//   blocks_128x128 (BLK128x128_32F): elements [128i .., 128k ..) at index i · round_up(⌈K / 128⌉, 4) + k.
// Tiled operands take no fast accumulation nor a bias, whole tiles along K (a multiple of 128), at most one of the
// two is in blocks, and one in 1×128 tiles has its rows (M for A, N for B) a multiple of 4.
enum class Fp8Scaling : std::uint8_t { tensor, tiles_1x128, blocks_128x128 };
// The FP8 kernels read rows that start 16-byte aligned: an fp8 operand's rows and inner size are padded to this many
// codes (block scaling's to whole tiles, fp8::block_tile).
inline constexpr std::int64_t fp8_row_alignment = 16;
// The scales of an operand stored [outer, K]: `rows` rows of `ld` floats (1 × 1 for one scale per tensor).
struct Fp8ScaleShape {
  std::int64_t rows = 1, ld = 1;
  std::int64_t count() const { return rows * ld; }
};
Fp8ScaleShape fp8_scale_shape(Fp8Scaling scaling, std::int64_t outer, std::int64_t K);

struct GemmFp8 {
  DType a = DType::f8e4m3, b = DType::f8e4m3;
  const float* a_scale_inv = nullptr;
  const float* b_scale_inv = nullptr;
  bool fast_accumulation = false;
  Fp8Scaling a_scaling = Fp8Scaling::tensor, b_scaling = Fp8Scaling::tensor;
  // Optional, with the GELU epilogue (gelu_input), per-tensor scales and beta 0: C written as fp8 codes of this format
  // (f8e4m3 or f8e5m2; rows 16 bytes apart) instead of values, code = fp8(GELU · *c_scale) saturated, where a kernel
  // of its own would read the sum back to quantize it (delayed scaling, whose scale is known before). *c_amax, where
  // given, is set (not merged) to the largest |GELU| before the scale. The bias and gelu_input stay in `dtype`.
  std::optional<DType> c_codes{};
  const float* c_scale = nullptr;
  float* c_amax = nullptr;
};

struct GemmArgs {
  // Of A, B, and of C and the bias unless wide_output (f32, f64, bf16 or f16); with fp8, of C and the bias only.
  DType dtype = DType::f32;
  std::int64_t M = 0, N = 0, K = 0, batch = 1;
  GemmOperand a = {}, b = {};
  GemmOutput c = {};
  double alpha = 1.0, beta = 0.0;
  // Optional: beta · addend (as C: C's dtype, rows c.ld apart, matrices c.batch_stride apart) in place of beta · C_i,
  // C then written without being read: e.g. a residual added in the product's epilogue without copying it into C.
  const void* addend = nullptr;
  // Optional: N values added to every row of every C_i (cuBLASLt's bias epilogue), in C's dtype.
  const void* bias = nullptr;
  // Optional, with a bias and one product (batch 1) of bf16, f16 or f32: cuBLASLt's GELU_AUX_BIAS epilogue. The sum
  // (product + bias) is rounded to C's dtype and written here, rows c.ld apart, and C = gelu_tanh of the sum, the
  // GELU computed on the unrounded sum. Saves reading the sum back for a separate activation pass.
  void* gelu_input = nullptr;
  // Optional, one product of bf16, f16 or f32, no bias, beta 0 (cuBLASLt's DGELU and DGELU_BGRAD epilogues: the
  // backward of gelu_input): C = alpha · op(A) · op(B), times gelu_tanh' of dgelu_input (laid out as C) before C's
  // rounding; and, where bias_gradient is given, the sums of C's columns there (N values in C's dtype).
  // (layernorm_mlp's backward measured them slower than its activation kernel: docs/layernorm_mlp.md.)
  const void* dgelu_input = nullptr;
  void* bias_gradient = nullptr;
  // C (and the bias) in the compute type (f32 for bf16/f16): the f32 accumulation rounded once to f32, e.g. for a
  // weight gradient that is then rounded once to a parameter dtype. No effect for f32 and f64.
  bool wide_output = false;
  // Optional: A and B in fp8 (above), C in dtype (bf16, f16 or f32) or as codes, a bias only with bf16 or f16 and
  // per-tensor scales; one product, the GELU epilogue only with C as codes, no GELU-derivative epilogue.
  const GemmFp8* fp8 = nullptr;
};

// Runs the product on `device`. Throws tapegrad::Error naming the shapes for a dtype without a GPU GEMM, negative
// sizes, leading dimensions shorter than their rows, overlapping output matrices, fp8 operands laid out or combined
// as no FP8 kernel takes them, or a cuBLASLt failure.
void gemm(const GemmArgs& args, int device);

}  // namespace tapegrad::cuda

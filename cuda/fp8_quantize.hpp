// FP8 quantization on the GPU: the amax of a tensor and its fp8 codes (with a transposed copy where a product reads
// it along its other dimension), bitwise the CPU's (ops/fp8/detail/quantize.hpp, tensor/core/fp8.hpp). Plain C++ (see
// tensor/gpu/backend.hpp for how ops call it). The work is queued on the device's current stream.
#pragma once

#include <cstdint>

#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

// *amax = max(*amax, max |x|) over the n elements of x (f32, bf16 or f16; a NaN wins, as on the CPU). The maximum is
// taken over the f32 bit patterns of |x|, which order as the values do (NaN above infinity): no order of the
// threads changes it, so the result is the same every run. x is read 16 bytes at a time (its first elements up to a
// 16-byte boundary, and the last ones, one at a time).
void fp8_amax(DType dtype, const void* x, std::int64_t n, float* amax, int device);

// Current scaling's scales, made by the quantization that uses them from an amax on the device (no kernel of their
// own): scale = max / *amax of the format (1 for an amax of 0, tensor/core/fp8.hpp's current_scale), written to
// *scale, and 1 / scale, what a GEMM multiplies the codes by, to *scale_inv.
struct Fp8CurrentScale {
  const float* amax = nullptr;
  float* scale = nullptr;
  float* scale_inv = nullptr;
};

// x [rows, cols] row-major in f32, bf16 or f16, quantized to `format` (f8e4m3 or f8e5m2: round to nearest even,
// saturating) with the scale at `scale` on the device, or current scaling's made from an amax: code = fp8(x · scale).
// One pass writes what is asked for; `amax` and current scaling's amax are x's alone.
struct Fp8Quantize {
  DType dtype = DType::f32;
  const void* x = nullptr;
  std::int64_t rows = 0, cols = 0;
  // The codes' rows and columns where they are more than x's (a padded operand made without a padded copy of x): x
  // fills their top left corner, zero codes the rest; 0: rows, cols.
  std::int64_t codes_rows = 0, codes_cols = 0;
  DType format = DType::f8e4m3;
  const float* scale = nullptr;            // read unless `current` makes the scale
  const Fp8CurrentScale* current = nullptr;  // the scale made from current->amax (written out, even for no x)
  void* codes = nullptr;  // [codes_rows, codes_cols]; null: none
  // [codes_cols, transposed_ld]: the codes transposed, zero in columns rows .. transposed_ld (a GEMM that sums over
  // the rows reads them with its inner size padded to 16 bytes); null: none.
  void* transposed = nullptr;
  std::int64_t transposed_ld = 0;  // 0: codes_rows
  float* amax = nullptr;  // *amax = max(*amax, max |x|) as fp8_amax computes it; null: none
  // x's column sums (a bias gradient) from the same pass: [fp8_column_partial_rows(rows), cols] f32, row t the sums of
  // x's rows 64t .. 64t + 63 in a fixed order, for cuda::sum_partials to add up; null: none.
  float* column_partials = nullptr;
};
void fp8_quantize(const Fp8Quantize& q, int device);

// The partial rows of x's column sums that fp8_quantize writes for x of `rows` rows.
constexpr std::int64_t fp8_column_partial_rows(std::int64_t rows) { return (rows + 63) / 64; }

// x [rows, cols] row-major in f32, bf16 or f16 (cols a multiple of 8, x 16-byte aligned) quantized to `format` at the
// scale at `scale`, or current scaling's made from an amax, as fp8_quantize does, each row's codes written over the
// row's own first `cols` bytes: the codes then take no memory beside x, rows cols · sizeof(x's type) bytes apart (x's
// values are given up).
struct Fp8QuantizeOver {
  DType dtype = DType::f32;
  void* x = nullptr;
  std::int64_t rows = 0, cols = 0;
  DType format = DType::f8e4m3;
  const float* scale = nullptr;              // read unless `current` makes the scale
  const Fp8CurrentScale* current = nullptr;  // as fp8_quantize's
  float* amax = nullptr;                     // *amax = max(*amax, max |x|), as fp8_quantize's; null: none
};
void fp8_quantize_over(const Fp8QuantizeOver& q, int device);

// codes [rows, cols] (rows `ld` bytes apart) transposed into [cols, transposed_ld] (transposed_ld >= rows; zero codes
// in columns rows .. transposed_ld), as fp8_quantize writes its transposed copy: the layout a product summing over the
// rows reads, made from codes whose values are gone.
void fp8_transpose(const void* codes, std::int64_t rows, std::int64_t cols, std::int64_t ld, void* transposed,
                   std::int64_t transposed_ld, int device);

}  // namespace tapegrad::cuda

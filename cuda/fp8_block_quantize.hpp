// Block scaling's quantization on the GPU (ops/fp8/recipe.hpp's BlockScaling, DeepSeek-V3's): e4m3 codes with a power
// of two scale per tile, bitwise the CPU's (ops/fp8/detail/quantize.hpp's block_quantized), and the tiles'
// dequantization scales laid out as cuBLASLt's block-scaled products read them (cuda/blaslt.hpp's Fp8Scaling). Plain
// C++ (see tensor/gpu/backend.hpp for how ops call it). The work is queued on the device's current stream.
#pragma once

#include <cstdint>

#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

// x [rows, cols] row-major in f32, bf16 or f16, quantized in one pass to what is asked for, as the top left corner of
// codes [codes_rows, codes_cols] (zero codes elsewhere: a padded operand without a padded copy of x):
//   tiles_1x128: the codes with a scale per 1×128 tile along each row, and the transposed codes
//     [codes_cols, transposed_ld] (zero in columns rows .. transposed_ld) with a scale per 1×128 tile along each of
//     their rows, i.e. per 128×1 tile of x: the two layouts of an activation or a gradient that one product sums over
//     its columns and another over its rows;
//   blocks_128x128: both layouts with a scale per 128×128 block of x (a weight).
// Each layout's scales (fp8_scale_shape(scaling, codes_rows, codes_cols) for the codes, fp8_scale_shape(scaling,
// codes_cols, transposed_ld) for the transpose) are the inverses of the tiles' scales, the largest power of two not
// above 448 / amax; a tile holding an infinity or a NaN gets a NaN there, which the products carry to their results.
struct Fp8BlockQuantize {
  DType dtype = DType::f32;
  const void* x = nullptr;
  std::int64_t rows = 0, cols = 0;
  Fp8Scaling scaling = Fp8Scaling::tiles_1x128;  // tiles_1x128 or blocks_128x128
  void* codes = nullptr;  // null: none
  std::int64_t codes_rows = 0;  // the codes' rows, zero codes past `rows` (0: rows)
  std::int64_t codes_cols = 0;  // the codes' columns, zero codes past `cols` (0: cols)
  float* scales = nullptr;
  void* transposed = nullptr;  // null: none
  std::int64_t transposed_ld = 0;  // 0: rows
  float* transposed_scales = nullptr;
};
void fp8_block_quantize(const Fp8BlockQuantize& q, int device);

}  // namespace tapegrad::cuda

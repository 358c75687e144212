// The activation step of layernorm_mlp on the GPU: a = fn(z₀)·gate(z₁) over rows of z = [z₀ | z₁] (z₁ only for gated
// activations), and its backward dz = da·∂a/∂z with the bias gradient Σ_rows dz. The same formulas as the CPU's
// ops/layernorm_mlp/detail/cpu_activation.hpp, per element from cuda/detail/activation_math.hpp. Plain C++.
#pragma once

#include <cstdint>

#include "tapegrad/tensor/core/dtype_tag.hpp"
#include "tapegrad/cuda/activation_form.hpp"

namespace tapegrad::cuda {

// a's fp8 codes, written by the forward in place of a: code = fp8(a · *scale) in f8e4m3 (the activation's format
// in every recipe), a rounded to the dtype first, bitwise what fp8_quantize makes of that a; or, with tile_scales,
// block scaling's codes with a scale per 1×128 tile of each row and the tiles' inverse scales at tile_scales, bitwise
// what fp8_block_quantize makes of that a's codes (F a multiple of 128, rows of 4, 16-byte aligned rows).
struct ActivationCodes {
  void* codes = nullptr;  // [rows, F]
  const float* scale = nullptr;  // unless tile_scales
  float* tile_scales = nullptr;  // [F / 128, rows], cuBLASLt's VEC128 layout (cuda/blaslt.hpp); null: one scale
};

// z [rows, width·F] → a [rows, F], or its fp8 codes where `codes` is given (a is then not written and may be null);
// where amax is given, *amax = max(*amax, max |a|) over a as rounded to the dtype, as fp8_amax computes it (delayed
// scaling's record, current scaling's amax without a pass of its own).
void mlp_activation_forward(DType dtype, int device, const ActivationForm& act, const void* z, void* a,
                            std::int64_t rows, std::int64_t F, const ActivationCodes* codes = nullptr,
                            float* amax = nullptr);

struct ActivationGrads {
  void* dz = nullptr;     // [rows, width·F] in dtype; may be z itself (each element is read, then written)
  void* a = nullptr;      // [rows, F]: a = act(z), bitwise the forward's, for dW2; may be da itself; null: none
  void* dbias = nullptr;  // [width·F] = Σ_rows dz (of dz as rounded to dtype), summed in the compute type; null: none
  void* partials = nullptr;  // scratch for dbias: mlp_activation_partials(rows, F, width) elements of the compute type
  bool wide_dbias = false;   // dbias in the compute type (rounded once to it) instead of dtype
};

// The scratch mlp_activation_backward needs for dbias, in elements of the compute type: a partial column sum per
// chunk of rows. The chunks depend on the shape only, so dbias does not depend on the GPU model.
std::int64_t mlp_activation_partials(std::int64_t rows, std::int64_t F, int width);

// z [rows, width·F], da [rows, F] → dz, and a and dbias where asked for: ONE kernel reads z and da once, writes dz,
// a and each chunk's partial column sums of dz; a second adds the partials in a fixed order (no atomics: bitwise
// the same on every run).
void mlp_activation_backward(DType dtype, int device, const ActivationForm& act, const void* z, const void* da,
                             const ActivationGrads& out, std::int64_t rows, std::int64_t F);

// The backward with fp8 outputs where their scales are known before the kernel: a's transposed codes (the forward
// made a's scale), and dz's codes in the layouts the products read (delayed scaling) or dz itself with its amax
// (current scaling, which makes dz's scale from it). Each code is bitwise what fp8_quantize makes of the dz (or a)
// that mlp_activation_backward writes, as is dz; dz's amax as fp8_amax takes it.
struct ActivationBackwardCodes {
  DType dz_format = DType::f8e5m2;
  const float* dz_scale = nullptr;  // needed for dz's codes
  void* dz_codes = nullptr;       // [rows, width·F]; null: none
  void* dz_transposed = nullptr;  // [width·F, transposed_ld]; null: none
  void* dz = nullptr;             // [rows, width·F] in dtype; may be z itself; null: none
  float* dz_amax = nullptr;       // *dz_amax = max(*dz_amax, max |dz|); null: none
  const float* a_scale = nullptr;
  void* a_transposed = nullptr;  // [F, transposed_ld] in f8e4m3; null: none
  // The transposes' row length: at least rows rounded up to 16, their codes past `rows` up to there made zero (a call
  // over rows r .. r + rows of a larger tensor, r a multiple of 16, takes that tensor's transposes from column r on).
  std::int64_t transposed_ld = 0;
  void* dbias = nullptr;  // as ActivationGrads's, summed from the partials
  // mlp_activation_codes_partials(rows, F, width) elements of the compute type: each chunk's partial column sums of dz,
  // written wherever given (a caller that splits the rows adds every call's partials itself: cuda::sum_partials).
  void* partials = nullptr;
  bool wide_dbias = false;
};

// The scratch of mlp_activation_backward_codes's dbias, in elements of the compute type.
std::int64_t mlp_activation_codes_partials(std::int64_t rows, std::int64_t F, int width);

// z [rows, width·F], da [rows, F] (f32, bf16 or f16; F a multiple of 16, rows 16-byte aligned) → the codes asked for,
// in one kernel over tiles of 64 × 64 (the transposes through shared memory), and dbias as mlp_activation_backward
// sums it but over the kernel's own chunks (bitwise the same every run, not necessarily the same bits as there).
void mlp_activation_backward_codes(DType dtype, int device, const ActivationForm& act, const void* z, const void* da,
                                   const ActivationBackwardCodes& out, std::int64_t rows, std::int64_t F);

}  // namespace tapegrad::cuda

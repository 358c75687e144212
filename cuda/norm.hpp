// Layer normalization and RMS normalization over the last axis on the GPU, forward and backward: host launchers in
// plain C++ (see tensor/gpu/backend.hpp for how ops call them). Used by the norm ops (ops/norm.cpp); written to serve
// any caller that holds x as [rows, hidden] (the fused layernorm_mlp node too).
//
// The maths is the CPU's (ops/detail/norm_rows.hpp), in the compute type C of the dtype (f32 for f32/bf16/f16, f64 for
// f64): per row mean and rstd in C, y = (x - mean)·rstd·g + beta rounded to the dtype once, g = gamma or 1 + gamma.
// Every pointer is device memory of `device`, row-major; tensors of the dtype unless said otherwise; work is queued on
// the device's current stream. Results are bitwise the same on every run.
#pragma once

#include <cstdint>

#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

// What is normalized, shared by forward and backward.
struct NormProblem {
  DType dtype = DType::f32;          // of x, gamma, beta, y, dy, dx, dgamma, dbeta
  std::int64_t rows = 0, hidden = 0;  // x is [rows, hidden]; gamma and beta are [hidden]
  // Elements from one row of x, y, dy and dx to the next (0: hidden; at least hidden). Rows padded to a multiple of
  // 16 bytes keep the 16-byte loads for any hidden size. The elements of x and dy past `hidden` do not matter; those
  // of y and dx are written zero (a padded operand, ready for a GEMM).
  std::int64_t ld = 0;
  bool centered = true;               // layernorm subtracts the row's mean; rmsnorm does not
  bool zero_centered_gamma = false;   // scale by 1 + gamma
};

struct NormForwardArgs {
  const void* x = nullptr;
  const void* gamma = nullptr;
  const void* beta = nullptr;  // null: no shift
  void* y = nullptr;
  void* mean = nullptr;  // C[rows], written for layernorm unless null (rmsnorm has none)
  void* rstd = nullptr;  // C[rows], written unless null
  double epsilon = 1e-6;  // added to the variance (rmsnorm: the mean square), in C
  // *amax = max(*amax, max |y|) over y as rounded to the dtype, as cuda::fp8_amax takes it (f32 bits: the same every
  // run), unless null: FP8 current scaling's amax of y, made where y is written rather than by a pass of its own.
  float* amax = nullptr;
};

// y = normalized x, and each row's statistics for the backward.
void norm_forward(const NormProblem& problem, const NormForwardArgs& args, int device);

struct NormBackwardArgs {
  const void* x = nullptr;
  const void* gamma = nullptr;
  const void* dy = nullptr;
  const void* mean = nullptr;  // C[rows] from norm_forward; layernorm only
  const void* rstd = nullptr;  // C[rows] from norm_forward
  void* dx = nullptr;          // each of dx, dgamma [hidden], dbeta [hidden]: written unless null
  void* dgamma = nullptr;
  void* dbeta = nullptr;
  // Optional, both or neither (other may be null without rows): the column sums of another [rows, hidden] tensor
  // whose rows lie ld apart as dy's (its elements past hidden do not matter), summed in the same pass and order as
  // dbeta and written like it. For a caller's bias gradient over the same rows (layernorm_mlp's db2): it saves that
  // sum its own pass and launches.
  const void* other = nullptr;
  void* other_sums = nullptr;
  // Optional, with dx: rows (ld apart, as dy's) added to dx before its rounding, e.g. a residual's gradient
  // (layernorm_mlp's dy, where it is `other` too: then read once).
  const void* dx_addend = nullptr;
  void* partials = nullptr;  // scratch: norm_backward_partials(problem, args) elements of C
  bool wide_parameter_grads = false;  // dgamma, dbeta, other_sums in C (summed in C, rounded once) instead of dtype
};

// The scratch norm_backward needs for the column sums `args` asks for (dgamma, dbeta, other_sums), in elements of C:
// a partial sum per block of rows and column. Depends on the problem's shape only, so the sums do not depend on the
// GPU model.
std::int64_t norm_backward_partials(const NormProblem& problem, const NormBackwardArgs& args);

// dx, dgamma, dbeta and other_sums (only those not null). One kernel writes dx and each block's partial column sums
// over its rows; a second adds the partials in a fixed order (deterministic: no atomics).
void norm_backward(const NormProblem& problem, const NormBackwardArgs& args, int device);

// The second derivatives: the vector-Jacobian product of norm_backward's (dx, dgamma, dbeta) at cotangents
// (u, c_gamma, c_beta), with respect to its inputs x, gamma and dy (the formulas of ops/detail/norm_second_order.hpp,
// in C from the forward's statistics). Rows unpadded (ld 0 or hidden).
struct NormSecondOrderArgs {
  const void* x = nullptr;
  const void* gamma = nullptr;
  const void* dy = nullptr;
  const void* mean = nullptr;     // C[rows] from norm_forward; layernorm only
  const void* rstd = nullptr;     // C[rows] from norm_forward
  const void* u = nullptr;        // [rows, hidden]: the cotangent of dx
  const void* c_gamma = nullptr;  // [hidden]: the cotangent of dgamma
  const void* c_beta = nullptr;   // [hidden]: the cotangent of dbeta, or null (a norm without a shift)
  void* dx = nullptr;             // [rows, hidden], [hidden], [rows, hidden]: the derivatives in x, gamma and dy
  void* dgamma = nullptr;
  void* ddy = nullptr;
  void* scratch = nullptr;  // norm_second_order_scratch(problem) elements of C
};

std::int64_t norm_second_order_scratch(const NormProblem& problem);

// One kernel writes dx and ddy and each block's partial column sums of dgamma; a second adds the partials in a fixed
// order (deterministic, as norm_backward).
void norm_second_order(const NormProblem& problem, const NormSecondOrderArgs& args, int device);

}  // namespace tapegrad::cuda

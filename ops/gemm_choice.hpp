// Which engine runs a CPU matrix product of a given shape: Eigen's contraction or the CBLAS. Neither wins
// everywhere (OpenBLAS with its kernel for the CPU is faster on large products; with kernels older than the CPU,
// as an OPENBLAS_CORETYPE can force, Eigen's can be faster), so the choice is measured: the first product of each
// (M, N, K, transposes, dtype) times both engines on its own operands and keeps the faster for the rest of the
// process, on every thread count (above 2^31 multiply-adds, where measuring would cost seconds, CBLAS runs). Products within a process are so bitwise reproducible, whatever the thread count;
// TAPEGRAD_GEMM=eigen or =blas in the environment fixes the engine for every size (reproducible across processes).
// Internal to ops/.
#pragma once

#include <cstdint>
#include <functional>

#include "tapegrad/ops/gemm.hpp"

namespace tapegrad::detail {

enum class GemmEngine { eigen, blas };

struct GemmProblem {
  std::int64_t M, N, K;
  Transpose trans_a, trans_b;
  bool f64;
  friend bool operator<(const GemmProblem& a, const GemmProblem& b);
};

// The engine for `problem`; where none is cached, `seconds(engine)` times one product of each engine (twice each,
// alternating, keeping the faster time) and the faster is cached. Thread-safe.
GemmEngine faster_engine(const GemmProblem& problem, const std::function<double(GemmEngine)>& seconds);

// How many problems have been measured (for tests).
std::int64_t measured_gemm_problems();

}  // namespace tapegrad::detail

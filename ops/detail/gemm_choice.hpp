// Which engine runs a CPU matrix product of a given shape: Eigen's contraction or the CBLAS. Neither wins
// everywhere (OpenBLAS with its kernel for the CPU is faster on large products; with kernels older than the CPU,
// as an OPENBLAS_CORETYPE can force, Eigen's can be faster), so the choice is measured: the first product of each
// (M, N, K, transposes, dtype) times both engines on its own operands and keeps the faster for the rest of the
// process, on every thread count (a product above 2^31 multiply-adds is timed on its first rows). Products within a
// process are so bitwise reproducible, whatever the thread count;
// TAPEGRAD_GEMM=eigen or =blas in the environment fixes the engine for every size (reproducible across processes).
// Internal to ops/.
#pragma once

#include <cstdint>
#include <functional>

#include "tapegrad/ops/detail/gemm.hpp"

namespace tapegrad::detail {

enum class GemmEngine { eigen, blas };

struct GemmProblem {
  std::int64_t M, N, K;
  Transpose trans_a, trans_b;
  bool f64;
  friend bool operator<(const GemmProblem& a, const GemmProblem& b);
};

// The engine for `problem`; where none is cached, `seconds(engine, rows)` times each engine on the first `rows` rows of
// the product (three times each, alternating, keeping each engine's fastest time) and the faster is cached. Rows are
// all M up to 2^31 multiply-adds; a larger product is timed on as many rows as make 2^31 (its speed, without the
// seconds a whole one costs), and one whose 64 rows are already larger runs CBLAS. Thread-safe.
GemmEngine faster_engine(const GemmProblem& problem, const std::function<double(GemmEngine, std::int64_t)>& seconds);

// How many problems have been measured (for tests).
std::int64_t measured_gemm_problems();

}  // namespace tapegrad::detail

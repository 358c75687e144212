#include "tapegrad/ops/detail/gemm_choice.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>

#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::detail {

namespace {

// The most multiply-adds one timed product may take (six are timed); larger products are timed on their first rows.
constexpr std::int64_t max_measured_work = std::int64_t{1} << 31;
constexpr std::int64_t min_measured_rows = 64;

struct Choices {
  std::mutex mutex;
  // By problem, not by thread count: a product then gives the same bits on every thread count, as every op does.
  std::map<GemmProblem, GemmEngine> engines;
  std::int64_t measured = 0;
};
Choices& choices() {
  static Choices c;
  return c;
}

// TAPEGRAD_GEMM: "eigen" or "blas" fixes the engine; unset or "measure" measures. Read once.
enum class Policy { measure, eigen, blas };
Policy policy() {
  static const Policy p = [] {
    const char* value = std::getenv("TAPEGRAD_GEMM");
    const std::string_view v = value ? value : "measure";
    check(v == "measure" || v == "eigen" || v == "blas", "gemm", "TAPEGRAD_GEMM is '", v,
          "'; it takes measure, eigen or blas");
    return v == "eigen" ? Policy::eigen : v == "blas" ? Policy::blas : Policy::measure;
  }();
  return p;
}

}  // namespace

bool operator<(const GemmProblem& a, const GemmProblem& b) {
  return std::tie(a.M, a.N, a.K, a.trans_a, a.trans_b, a.f64) < std::tie(b.M, b.N, b.K, b.trans_a, b.trans_b, b.f64);
}

GemmEngine faster_engine(const GemmProblem& problem, const std::function<double(GemmEngine, std::int64_t)>& seconds) {
  if (policy() != Policy::measure) return policy() == Policy::eigen ? GemmEngine::eigen : GemmEngine::blas;
  const std::int64_t rows = std::min(problem.M, max_measured_work / (problem.N * problem.K));
  if (rows < std::min(problem.M, min_measured_rows)) return GemmEngine::blas;  // even 64 rows cost too much to time
  Choices& c = choices();
  {
    std::lock_guard lock(c.mutex);
    if (const auto found = c.engines.find(problem); found != c.engines.end()) return found->second;
  }
  // Measured unlocked (a product may run on the pool, whose threads may multiply too); the first result stays.
  // Three rounds: Eigen allocates its packing buffers per product, and the first two can land on fresh pages (each
  // a page fault, 12-26 µs on a VM), where OpenBLAS keeps its buffers; with two rounds Eigen lost products it
  // runs 1.4x faster.
  double eigen = seconds(GemmEngine::eigen, rows), blas = seconds(GemmEngine::blas, rows);
  for (int round = 1; round < 3; ++round) {
    eigen = std::min(eigen, seconds(GemmEngine::eigen, rows));
    blas = std::min(blas, seconds(GemmEngine::blas, rows));
  }
  std::lock_guard lock(c.mutex);
  const auto [at, inserted] = c.engines.emplace(problem, eigen < blas ? GemmEngine::eigen : GemmEngine::blas);
  if (inserted) ++c.measured;
  return at->second;
}

std::int64_t measured_gemm_problems() {
  std::lock_guard lock(choices().mutex);
  return choices().measured;
}

}  // namespace tapegrad::detail

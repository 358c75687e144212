#include "tapegrad/ops/gemm_choice.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>

#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::detail {

namespace {

// Above this many multiply-adds CBLAS runs without a measurement (which would cost four such products).
constexpr std::int64_t max_measured_work = std::int64_t{1} << 31;

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

GemmEngine faster_engine(const GemmProblem& problem, const std::function<double(GemmEngine)>& seconds) {
  if (policy() != Policy::measure) return policy() == Policy::eigen ? GemmEngine::eigen : GemmEngine::blas;
  if (problem.M * problem.N * problem.K > max_measured_work) return GemmEngine::blas;
  Choices& c = choices();
  {
    std::lock_guard lock(c.mutex);
    if (const auto found = c.engines.find(problem); found != c.engines.end()) return found->second;
  }
  // Measured unlocked (a product may run on the pool, whose threads may multiply too); the first result stays.
  double eigen = seconds(GemmEngine::eigen), blas = seconds(GemmEngine::blas);
  eigen = std::min(eigen, seconds(GemmEngine::eigen));
  blas = std::min(blas, seconds(GemmEngine::blas));
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

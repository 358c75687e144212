// Helpers for the op tests: comparing a result with a double reference under a tolerance, bitwise comparison, the
// moments of a tensor's values, and running a block with a given thread count.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "tapegrad/tensor/eigen.hpp"
#include "tapegrad/tensor/tensor.hpp"

TYPE_TO_STRING(tapegrad::bf16);
TYPE_TO_STRING(tapegrad::f16);

namespace tapegrad::test {

// A fresh seed for a test's random inputs, or TAPEGRAD_TEST_SEED's: the seed a failure printed, to run it again.
inline std::uint64_t fresh_seed() {
  if (const char* s = std::getenv("TAPEGRAD_TEST_SEED"); s && *s) return std::stoull(s);
  return std::random_device{}();
}

// atol_in_rms: atol counts in units of the reference's root mean square where that exceeds 1 (for sums over many
// terms, whose rounding grows with their typical size while single elements may cancel to near zero).
struct Tolerance {
  double rtol, atol;
  bool atol_in_rms = false;
};

inline double root_mean_square(const Tensor<double>& t) {
  double sum_sq = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) sum_sq += t.flat(i) * t.flat(i);
  return t.numel() == 0 ? 0.0 : std::sqrt(sum_sq / static_cast<double>(t.numel()));
}

// The element farthest outside the tolerance: its index and |got - want| / (atol + rtol·|want|) (<= 1 passes).
struct Worst {
  double ratio = 0.0;
  std::int64_t at = 0;
};
template <class T> Worst worst_element(const Tensor<T>& got, const Tensor<double>& want, Tolerance tol) {
  REQUIRE(got.shape() == want.shape());
  const double atol = tol.atol * (tol.atol_in_rms ? std::max(1.0, root_mean_square(want)) : 1.0);
  Worst worst;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double diff = std::abs(convert<double>(got.flat(i)) - want.flat(i));
    double ratio = diff == 0.0 ? 0.0 : diff / (atol + tol.rtol * std::abs(want.flat(i)));
    if (std::isnan(ratio)) ratio = std::numeric_limits<double>::infinity();
    if (ratio > worst.ratio) worst = {ratio, i};
  }
  return worst;
}

// Checks |got - want| <= atol + rtol·|want| for every element; a failure names the worst element.
template <class T> void check_close(const Tensor<T>& got, const Tensor<double>& want, Tolerance tol) {
  const Worst worst = worst_element(got, want, tol);
  INFO("worst element ", worst.at, " of shape ", got.shape(), ": got ", convert<double>(got.flat(worst.at)),
       ", want ", want.flat(worst.at), " (rtol ", tol.rtol, ", atol ", tol.atol, tol.atol_in_rms ? " × the reference's rms" : "", ")");
  CHECK(worst.ratio <= 1.0);
}

// ‖got - want‖₂ / ‖want‖₂: the error of a whole tensor, for results (sums of many quantized products) whose single
// elements may legitimately move far, e.g. where a ReLU's mask flips under quantization.
template <class T> double relative_error(const Tensor<T>& got, const Tensor<double>& want) {
  REQUIRE(got.shape() == want.shape());
  double diff_sq = 0, want_sq = 0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double diff = convert<double>(got.flat(i)) - want.flat(i);
    diff_sq += diff * diff;
    want_sq += want.flat(i) * want.flat(i);
  }
  return diff_sq == 0 ? 0.0 : std::sqrt(diff_sq / want_sq);  // an exact match is no error, also where want is 0
}

template <class T> bool bitwise_equal(const Tensor<T>& a, const Tensor<T>& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(T)) == 0;
}

// Mean, standard deviation and range of a tensor's values, in double.
struct Moments {
  double mean = 0, stddev = 0, min = INFINITY, max = -INFINITY;
};
template <class T> Moments moments(const Tensor<T>& t) {
  Moments m;
  double sum = 0, sum_sq = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double v = convert<double>(t.flat(i));
    sum += v;
    sum_sq += v * v;
    m.min = std::min(m.min, v);
    m.max = std::max(m.max, v);
  }
  const double n = static_cast<double>(t.numel());
  m.mean = sum / n;
  m.stddev = std::sqrt(std::max(0.0, sum_sq / n - m.mean * m.mean));
  return m;
}

// Sets the pool's thread count for the scope's lifetime.
class ThreadCount {
 public:
  explicit ThreadCount(int threads) : previous_(num_threads()) { set_num_threads(threads); }
  ~ThreadCount() { set_num_threads(previous_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int previous_;
};

}  // namespace tapegrad::test

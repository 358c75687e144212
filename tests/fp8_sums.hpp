// What the tests of FP8 products on the GPU (tests/test_gpu_fp8_kernels.cpp, tests/test_gpu_fp8_blocks.cpp) hold
// their results to. The products of fp8 values are exact; their sum is not: Hopper's tensor cores keep about 14 bits
// in the partial sums of an FP8 instruction chain, which cuBLASLt promotes to f32 every few instructions (or, with
// fast accumulation, only at the end). Each element is held within 2^-16 · K (fast: 2^-12 · K) of the sum of its
// terms' magnitudes, plus the output's rounding: loose for rounding, tight against a wrong scale, operand or layout,
// whose errors are of the order of the values.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tapegrad/tapegrad.hpp"

namespace tapegrad::test {

// got [M, N] (in O) against initial(i, j) + Σ_k a(i, k) · b(j, k) in double.
template <class O, class A, class B, class Initial>
void check_fp8_sums(const Tensor<O>& got, std::int64_t M, std::int64_t N, std::int64_t K, A a, B b, Initial initial,
                    bool fast) {
  const double accumulation = (fast ? 0x1p-12 : 0x1p-16) * static_cast<double>(K);
  const double rounding = std::is_same_v<O, float> ? 0x1p-24 : 0x1p-8;
  std::int64_t bad = 0, first = -1;
  for (std::int64_t i = 0; i < M; ++i) {
    for (std::int64_t j = 0; j < N; ++j) {
      double sum = initial(i, j), magnitude = std::abs(sum);
      for (std::int64_t k = 0; k < K; ++k) {
        const double term = a(i, k) * b(j, k);
        sum += term;
        magnitude += std::abs(term);
      }
      const double error = std::abs(convert<double>(got.flat(i * N + j)) - sum);
      if (error > accumulation * magnitude + rounding * std::abs(sum) + 1e-30) {
        if (bad++ == 0) first = i * N + j;
      }
    }
  }
  INFO("first element out of tolerance: ", first);
  CHECK(bad == 0);
}

}  // namespace tapegrad::test

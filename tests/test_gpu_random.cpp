// Random tensors and initializers made on the GPU against the same ones made on the cpu: every factory and every
// initializer, in every dtype, for empty, one-element, odd and large sizes and several seeds. Uniform, integer and
// constant tensors must be bitwise equal; normal ones within the bounds tensor/factories.hpp and
// tensor/initializers.hpp state (the tests report how many elements differ at all, for the README's figures).
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tapegrad/tensor/gpu/device.hpp"
#include "gpu_random_checks.hpp"
#include "gpu_reference.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::bitwise_equal;
using test::check_normal_draws;
using test::gpu;

namespace {

const Device host = Device::cpu();
// Empty, one element, odd, and large (prime) element counts.
const std::vector<std::int64_t> sizes{0, 1, 7, 1000003};
const std::vector<std::uint64_t> seeds{0, 1, 0x9e3779b97f4a7c15ULL};

// The position of an f32 in the ordered line of floats, so that adjacent floats are 1 apart.
std::int64_t float_index(float x) {
  const auto bits = std::bit_cast<std::int32_t>(x);
  return bits < 0 ? std::int64_t{std::numeric_limits<std::int32_t>::min()} - bits : bits;
}

// Checks that f32 draws `got` are within `bound` ulps of `want` and reports how many are 0, 1, ... ulps apart.
void ulp_histogram(const std::string& what, const Tensor<float>& got, const Tensor<float>& want, int bound) {
  std::vector<std::int64_t> histogram(static_cast<std::size_t>(bound) + 2, 0);  // the last bin: beyond the bound
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const std::int64_t ulps = std::abs(float_index(got.flat(i)) - float_index(want.flat(i)));
    ++histogram[static_cast<std::size_t>(std::min<std::int64_t>(ulps, bound + 1))];
  }
  std::string counts;
  for (const std::int64_t count : histogram) counts.append(" ").append(std::to_string(count));
  MESSAGE(what, ": elements 0, 1, ... ulps from the cpu's (the last count: beyond the bound):", counts);
  CHECK(histogram.back() == 0);
}

template <class T> std::int64_t differing(const Tensor<T>& a, const Tensor<T>& b) {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) n += !(a.flat(i) == b.flat(i));
  return n;
}

// Runs check(a, b, n, seed) for each parameter pair (a range, or a mean and a standard deviation), size and seed.
template <class P, class Check> void sweep(std::initializer_list<std::pair<P, P>> parameters, const Check& check) {
  for (const std::pair<P, P>& p : parameters) {
    const P a = p.first, b = p.second;
    for (const std::int64_t n : sizes) {
      for (const std::uint64_t seed : seeds) {
        CAPTURE(a);
        CAPTURE(b);
        CAPTURE(n);
        CAPTURE(seed);
        check(a, b, n, seed);
      }
    }
  }
}

// Every initializer, with the ulp bound its GPU values keep from the cpu's (0: bitwise) and its mean.
struct InitializerCase {
  Initializer init;
  int ulp_bound;
  double mean;
};
std::vector<InitializerCase> initializer_cases() {
  return {
      {Initializer::zeros(), 0, 0.0},
      {Initializer::ones(), 0, 0.0},
      {Initializer::constant(0.3), 0, 0.0},
      {Initializer::uniform(-0.1, 0.3), 0, 0.0},
      {Initializer::glorot_uniform(), 0, 0.0},
      {Initializer::lecun_uniform(), 0, 0.0},
      {Initializer::he_uniform(), 0, 0.0},
      {Initializer::variance_scaling(1.0, FanMode::fan_avg, Distribution::uniform), 0, 0.0},
      {Initializer::normal(0.02), randn_ulp_bound, 0.0},
      {Initializer::normal(2.0, 0.5), randn_ulp_bound, 0.5},
      {Initializer::variance_scaling(0.5, FanMode::fan_out, Distribution::normal), randn_ulp_bound, 0.0},
      {Initializer::truncated_normal(0.02), truncated_normal_ulp_bound, 0.0},
      {Initializer::truncated_normal(1.5, -1.0, -3.0, 1.0), truncated_normal_ulp_bound, -1.0},
      {Initializer::glorot_normal(), truncated_normal_ulp_bound, 0.0},
      {Initializer::lecun_normal(), truncated_normal_ulp_bound, 0.0},
      {Initializer::he_normal(), truncated_normal_ulp_bound, 0.0},
  };
}

}  // namespace

TEST_CASE_TEMPLATE("rand_uniform on the GPU is bitwise the cpu's, the step below high included",
                   T, TAPEGRAD_GPU_DTYPES) {
  // [-3, 5) rounds draws up to 5 in bf16 and f16 (the step below it); [2, 2] is the empty range.
  sweep<double>({{0.0, 1.0}, {-3.0, 5.0}, {1.0, 2.0}, {2.0, 2.0}},
                [](double low, double high, std::int64_t n, std::uint64_t seed) {
                  const Tensor<T> on_gpu = rand_uniform<T>({n}, seed, low, high, gpu);
                  CHECK(on_gpu.device() == gpu);
                  CHECK(bitwise_equal(on_gpu.to(host), rand_uniform<T>({n}, seed, low, high)));
                });
}

TEST_CASE_TEMPLATE("rand_int on the GPU is bitwise the cpu's", T, std::int32_t, std::int64_t) {
  const std::int64_t widest = std::int64_t{1} << 32;
  sweep<std::int64_t>({{-50, 50}, {0, 1}, {0, widest}, {-(widest / 2), widest / 2}},
                      [](std::int64_t low, std::int64_t high, std::int64_t n, std::uint64_t seed) {
                        const Tensor<T> on_gpu = rand_int<T>({n}, seed, low, high, gpu);
                        CHECK(on_gpu.device() == gpu);
                        CHECK(bitwise_equal(on_gpu.to(host), rand_int<T>({n}, seed, low, high)));
                      });
}

TEST_CASE("a GPU's standard normal draws are within their ulp bounds of the cpu's") {
  // Initializer::truncated_normal(1) with mean 0 is the truncated standard draw itself (fma(1, z, 0) = z).
  const Tensor<float> normal = randn<float>({1000003}, 7, 0.0, 1.0, gpu).to(host);
  ulp_histogram("randn", normal, randn<float>({1000003}, 7), randn_ulp_bound);
  const Initializer truncated = Initializer::truncated_normal(1.0);
  ulp_histogram("truncated normal", truncated.make<float>({1000003}, 7, {}, gpu).to(host),
                truncated.make<float>({1000003}, 7), truncated_normal_ulp_bound);
  // Rounded to bf16 and f16, only draws that straddle a rounding boundary of T differ (checked by the tests below).
  MESSAGE("randn elements that differ from the cpu's in bf16: ",
          differing(randn<bf16>({1000003}, 7, 0.0, 1.0, gpu).to(host), randn<bf16>({1000003}, 7)),
          ", in f16: ", differing(randn<f16>({1000003}, 7, 0.0, 1.0, gpu).to(host), randn<f16>({1000003}, 7)),
          " of 1000003");
}

TEST_CASE_TEMPLATE("randn on the GPU equals the cpu's within the documented bound", T, TAPEGRAD_GPU_DTYPES) {
  sweep<double>({{0.0, 1.0}, {0.5, 2.0}, {3.0, 0.02}},  // (mean, stddev)
                [](double mean, double stddev, std::int64_t n, std::uint64_t seed) {
                  const Tensor<T> on_gpu = randn<T>({n}, seed, mean, stddev, gpu);
                  CHECK(on_gpu.device() == gpu);
                  check_normal_draws(on_gpu.to(host), randn<T>({n}, seed, mean, stddev), mean, randn_ulp_bound);
                });
}

TEST_CASE("random tensors on the GPU are the same every run") {
  const Tensor<float> first = randn<float>({1000003}, 5, 0.0, 1.0, gpu).to(host);
  CHECK(bitwise_equal(randn<float>({1000003}, 5, 0.0, 1.0, gpu).to(host), first));
  const Tensor<bf16> truncated = Initializer::he_normal().make<bf16>({1000, 1001}, 6, {}, gpu).to(host);
  CHECK(bitwise_equal(Initializer::he_normal().make<bf16>({1000, 1001}, 6, {}, gpu).to(host), truncated));
}

TEST_CASE_TEMPLATE("every initializer on the GPU equals the cpu's: constants and uniforms bitwise, normals within "
                   "their bound",
                   T, TAPEGRAD_GPU_DTYPES) {
  // [rows, 1] has fan_in = rows and fan_out = 1; the empty [0, 5, 3] counts axis 0 as a batch axis, so that its fans
  // are 5 and 3 and every variance scaling is defined.
  std::vector<std::pair<Shape, FanAxes>> shapes{{{0, 5, 3}, {.in = {1}, .out = {2}, .batch = {0}}}};
  for (const std::int64_t n : sizes) {
    if (n > 0) shapes.push_back({{n, 1}, {}});
  }
  for (const InitializerCase& c : initializer_cases()) {
    for (const std::pair<Shape, FanAxes>& entry : shapes) {
      const Shape& shape = entry.first;
      const FanAxes& axes = entry.second;
      for (const std::uint64_t seed : seeds) {
        CAPTURE(c.init.name());
        CAPTURE(shape);
        CAPTURE(seed);
        const Tensor<T> on_gpu = c.init.make<T>(shape, seed, axes, gpu);
        CHECK(on_gpu.device() == gpu);
        CHECK(on_gpu.shape() == shape);
        const Tensor<T> want = c.init.make<T>(shape, seed, axes);
        if (c.ulp_bound == 0) {
          CHECK(bitwise_equal(on_gpu.to(host), want));
        } else {
          check_normal_draws(on_gpu.to(host), want, c.mean, c.ulp_bound);
        }
      }
    }
  }
  // Fan axes travel to the GPU too: a stacked layernorm_mlp kernel [H, 2, F].
  const FanAxes stacked{.in = {0}, .out = {2}, .batch = {1}};
  CHECK(bitwise_equal(Initializer::glorot_uniform().make<T>({33, 2, 17}, 3, stacked, gpu).to(host),
                      Initializer::glorot_uniform().make<T>({33, 2, 17}, 3, stacked)));
}

TEST_CASE("random factories on a GPU check their arguments and the device as on the cpu") {
  CHECK_THROWS_WITH_AS(rand_uniform<float>({3}, 0, 2.0, 1.0, gpu),
                       doctest::Contains("rand_uniform: low 2 is greater than high 1"), Error);
  CHECK_THROWS_WITH_AS(rand_int<std::int32_t>({3}, 0, 4, 4, gpu), doctest::Contains("rand_int: empty range [4, 4)"),
                       Error);
  const Device missing = Device::cuda(cuda::device_count());
  CHECK_THROWS_WITH_AS(randn<float>({3}, 0, 0.0, 1.0, missing), doctest::Contains(missing.str().c_str()), Error);
  CHECK_THROWS_WITH_AS(Initializer::lecun_uniform().make<bf16>({3, 4}, 0, {}, missing),
                       doctest::Contains(missing.str().c_str()), Error);
}

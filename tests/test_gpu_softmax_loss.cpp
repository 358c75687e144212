// softmax, log_softmax, mse_loss and cross_entropy on the GPU against the CPU in double (tests/gpu_reference.hpp),
// forward and every gradient: every axis, lines short and long (a 50257-class vocabulary), huge logits, one row and
// none; bitwise run-to-run determinism of the losses; label and device errors on the GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "gpu_reference.hpp"

using namespace tapegrad;
using test::GpuInput;
using test::Tolerance;

namespace {

// ---- softmax ------------------------------------------------------------------------------------------------------

template <class U> Var<U> apply_softmax(bool log, const Var<U>& x, int axis) {
  return log ? log_softmax(x, axis) : softmax(x, axis);
}
std::string softmax_name(bool log) { return log ? "log_softmax" : "softmax"; }

struct Case {
  Shape shape;
  int axis;
};
// Each path: rows (the last axis) with a warp or a block per row, in 16-byte packs or single elements; strided lines
// (any other axis), short and long; single-element lines; empty tensors.
const Case softmax_cases[] = {
    {{3, 5, 7}, 0},  {{3, 5, 7}, 1},  {{3, 5, 7}, 2}, {{3, 5, 7}, -2},  // every axis of a rank-3 shape with odd dims
    {{2, 50257}, -1},                                                    // block per row, single elements
    {{50257, 3}, 0},                                                     // strided, long lines
    {{3, 4096}, 1},                                                      // block per row, packs
    {{7, 1000}, -1},                                                     // warp per row, packs
    {{1000, 33}, 0},                                                     // strided, many lines
    {{1}, 0},        {{5, 1, 3}, 1},                                     // lines of one element
    {{0, 5}, 1},     {{0, 5}, 0},                                        // empty
};

// Against the double reference on the same inputs: f64 differs in summation order only; f32 carries sums of up to
// 50257 exponentials (~1e-6 relative); bf16 and f16 are the result's rounding (at most an ulp when the f32 value
// lies near a tie: 2⁻⁷ and 2⁻¹⁰ relative). The atol covers gradients near zero after cancellation in f32
// (dy - p·Σ dy: 6e-8·|dy|) and f16's subnormals (spacing 6e-8; probabilities of 1/50257 are subnormal).
template <class T> constexpr Tolerance softmax_tolerance{};
template <> constexpr Tolerance softmax_tolerance<double>{1e-10, 1e-12};
// f32, measured on the H200: relative up to 3.2e-5 over lines of 50257; absolute 1.5e-7 where dy - p·Σdy cancels
// (|dy| up to 4.5 among 150771 draws: 6e-8·|dy| = 2.7e-7).
template <> constexpr Tolerance softmax_tolerance<float>{5e-5, 5e-7};
template <> constexpr Tolerance softmax_tolerance<bf16>{1e-2, 1e-7};
template <> constexpr Tolerance softmax_tolerance<f16>{2e-3, 1e-7};

// ---- losses -------------------------------------------------------------------------------------------------------

Tensor<std::int64_t> labels_for(const Shape& logits, std::uint64_t seed) {
  const auto dims = logits.to_vector();
  return rand_int<std::int64_t>(Shape(std::vector<std::int64_t>(dims.begin(), dims.end() - 1)), seed, 0,
                                logits.dim(-1));
}

// Logits shapes: one row (rank 1, and of a 50257-class vocabulary), several, and each row path of softmax.
const Shape loss_shapes[] = {{7}, {1, 50257}, {5, 33}, {1000, 64}, {3, 4, 1000}, {2, 4099}, {4, 4096}};

// Against the double reference: the loss is a mean of values of size log(classes) (mse: about 2), the gradients
// are of size dL/rows per element (mse: dL/numel). f32 sums up to 50257 terms per row and up to 1000003 squares
// (~1e-6 relative); bf16 and f16 as for softmax; the atol covers f16's subnormal gradients (spacing 6e-8: mse's
// over a million elements, and gradients of size 1/50257).
template <class T> constexpr Tolerance loss_tolerance{};
template <> constexpr Tolerance loss_tolerance<double>{1e-10, 1e-12};
template <> constexpr Tolerance loss_tolerance<float>{2e-5, 1e-7};
template <> constexpr Tolerance loss_tolerance<bf16>{1e-2, 1e-7};
template <> constexpr Tolerance loss_tolerance<f16>{2e-3, 1e-7};

}  // namespace

TEST_CASE_TEMPLATE("softmax and log_softmax on the GPU match the CPU along every axis, forward and backward",
                   T, TAPEGRAD_GPU_DTYPES) {
  std::uint64_t seed = 1;
  for (bool log : {false, true}) {
    for (const Case& c : softmax_cases) {
      const std::string op = softmax_name(log);
      CAPTURE(op);
      CAPTURE(c.shape);
      CAPTURE(c.axis);
      test::check_against_cpu<T>(
          op, [&](const auto& v) { return apply_softmax(log, v[0], c.axis); }, {{c.shape}}, softmax_tolerance<T>,
          seed++);
    }
  }
}

TEST_CASE_TEMPLATE("softmax, log_softmax and cross_entropy of huge logits stay finite on the GPU",
                   T, TAPEGRAD_GPU_DTYPES) {
  // Logits of N(0, 80²): exp of most of them overflows even f64; after the max is subtracted nothing does.
  // Tolerance: as softmax_tolerance, but log-sum-exp is a value near the max (~350), held in f32 to within half its
  // ulp of 3e-5: every log_softmax output and every exp(x - lse) carries that absolute error.
  const Tolerance tol{softmax_tolerance<T>.rtol, std::is_same_v<T, double> ? 1e-10 : 1e-4};
  for (const Case& c : {Case{{4, 1000}, -1}, Case{{2, 50257}, -1}, Case{{300, 5}, 0}}) {
    CAPTURE(c.shape);
    CAPTURE(c.axis);
    const std::vector<GpuInput> inputs{{c.shape}};
    const std::vector<Tensor<T>> logits{randn<T>(c.shape, 7, 0.0, 80.0)};
    for (bool log : {false, true}) {
      const auto run = test::check_values_against_cpu<T>(
          softmax_name(log), [&](const auto& v) { return apply_softmax(log, v[0], c.axis); }, inputs, logits, tol,
          8);
      for (std::int64_t i = 0; i < run.y.numel(); ++i) REQUIRE(std::isfinite(run.y.flat(i)));
    }
    if (c.axis == -1) {
      const Tensor<std::int64_t> labels = labels_for(c.shape, 9);
      const auto run = test::check_values_against_cpu<T>(
          "cross_entropy", [&](const auto& v) { return cross_entropy(v[0], labels.to(v[0].device())); }, inputs,
          logits, tol, 10);
      CHECK(std::isfinite(run.y.item()));
    }
  }
}

TEST_CASE_TEMPLATE("mse_loss on the GPU matches the CPU, with gradients to both inputs", T, TAPEGRAD_GPU_DTYPES) {
  std::uint64_t seed = 20;
  for (const Shape& shape : {Shape{}, Shape{1}, Shape{7}, Shape{33, 31}, Shape{2, 3, 1000}, Shape{1000003}}) {
    CAPTURE(shape);
    test::check_against_cpu<T>(
        "mse_loss", [](const auto& v) { return mse_loss(v[0], v[1]); }, {{shape}, {shape}}, loss_tolerance<T>,
        seed++);
    // Only the target requires grad.
    test::check_against_cpu<T>(
        "mse_loss", [](const auto& v) { return mse_loss(v[0], v[1]); }, {{shape, GpuInput::normal, false}, {shape}},
        loss_tolerance<T>, seed++);
  }
}

TEST_CASE_TEMPLATE("cross_entropy with labels on the GPU matches the CPU", T, TAPEGRAD_GPU_DTYPES) {
  std::uint64_t seed = 40;
  for (const Shape& shape : loss_shapes) {
    CAPTURE(shape);
    const Tensor<std::int64_t> labels = labels_for(shape, seed);
    test::check_against_cpu<T>(
        "cross_entropy", [&](const auto& v) { return cross_entropy(v[0], labels.to(v[0].device())); }, {{shape}},
        loss_tolerance<T>, seed++);
  }
}

TEST_CASE_TEMPLATE("cross_entropy with soft targets on the GPU matches the CPU, with gradients to both inputs",
                   T, TAPEGRAD_GPU_DTYPES) {
  std::uint64_t seed = 60;
  for (const Shape& shape : loss_shapes) {
    CAPTURE(shape);
    // Targets like probabilities, uniform in [0, 2/classes): each row sums to about 1 but not exactly, so the
    // gradient's softmax·Σq term counts (and the loss stays of size log(classes), within f16's range).
    const double high = 2.0 / static_cast<double>(shape.dim(-1));
    const std::vector<Tensor<T>> values{randn<T>(shape, seed), rand_uniform<T>(shape, seed + 1, 0.0, high)};
    test::check_values_against_cpu<T>(
        "cross_entropy", [](const auto& v) { return cross_entropy(v[0], v[1]); }, {{shape}, {shape}}, values,
        loss_tolerance<T>, seed);
    seed += 2;
  }
}

TEST_CASE_TEMPLATE("losses on the GPU are bitwise the same on every run", T, float, bf16) {
  const Shape shape{1000, 1003};  // 1003003 elements: many partial sums for mse, 1000 rows for cross_entropy
  const Tensor<T> x = randn<T>(shape, 80).to(test::gpu), y = randn<T>(shape, 81).to(test::gpu);
  const Tensor<T> q = rand_uniform<T>(shape, 82).to(test::gpu);
  const Tensor<std::int64_t> labels = labels_for(shape, 83).to(test::gpu);
  const auto losses = [&] {
    return std::vector<Tensor<T>>{mse_loss(constant(x), constant(y)).value().to(Device::cpu()),
                                  cross_entropy(constant(x), labels).value().to(Device::cpu()),
                                  cross_entropy(constant(x), constant(q)).value().to(Device::cpu())};
  };
  const auto first = losses(), second = losses();
  for (std::size_t k = 0; k < first.size(); ++k) {
    CAPTURE(k);
    CHECK(test::bitwise_equal(first[k], second[k]));
  }
}

TEST_CASE("losses of no elements are NaN on the GPU, as on the CPU") {
  const auto empty = constant(zeros<float>({0, 5}, test::gpu));
  CHECK(std::isnan(mse_loss(empty, empty).value().to(Device::cpu()).item()));
  CHECK(std::isnan(cross_entropy(empty, zeros<std::int64_t>({0}).to(test::gpu)).value().to(Device::cpu()).item()));
  CHECK(std::isnan(cross_entropy(empty, empty).value().to(Device::cpu()).item()));
}

TEST_CASE("cross_entropy on the GPU rejects a label out of range with the CPU's message, and stays usable") {
  const auto logits = constant(randn<float>({2, 3, 5}, 90).to(test::gpu));
  Tensor<std::int64_t> labels = zeros<std::int64_t>({2, 3});
  labels(0, 2) = 3;
  labels(1, 2) = 7;
  labels(1, 1) = 5;  // the first of two bad labels is reported, as on the CPU
  CHECK_THROWS_WITH_AS(cross_entropy(logits, labels.to(test::gpu)),
                       doctest::Contains("cross_entropy: label 5 at position [1, 1] is out of range for 5 classes "
                                         "(logits of shape [2, 3, 5])"),
                       Error);
  labels(1, 1) = 0;
  labels(1, 2) = -1;
  CHECK_THROWS_WITH_AS(cross_entropy(logits, labels.to(test::gpu)),
                       doctest::Contains("cross_entropy: label -1 at position [1, 2] is out of range for 5 classes"),
                       Error);
  labels(1, 2) = 4;
  const Var<float> loss = cross_entropy(logits, labels.to(test::gpu));
  const double want = cross_entropy(constant(cast<double>(logits.value().to(Device::cpu()))), labels).value().item();
  CHECK(convert<double>(loss.value().to(Device::cpu()).item()) == doctest::Approx(want).epsilon(1e-5));
}

TEST_CASE("loss and softmax errors on the GPU name the op, the shapes and the devices") {
  const auto x = constant(randn<float>({2, 3}, 100).to(test::gpu));
  CHECK_THROWS_WITH_AS(cross_entropy(x, zeros<std::int64_t>({2})),
                       doctest::Contains("cross_entropy: input 0 is on cuda:0 but input 1 is on cpu"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(x, zeros<std::int64_t>({3}).to(test::gpu)),
                       doctest::Contains("cross_entropy: labels have shape [3] but logits of shape [2, 3] need labels "
                                         "of shape [2]"),
                       Error);
  CHECK_THROWS_WITH_AS(cross_entropy(x, constant(randn<float>({2, 3}, 101))),
                       doctest::Contains("cross_entropy: input 0 is on cuda:0 but input 1 is on cpu"), Error);
  CHECK_THROWS_WITH_AS(mse_loss(x, constant(randn<float>({2, 3}, 102))),
                       doctest::Contains("mse_loss: input 0 is on cuda:0 but input 1 is on cpu"), Error);
  CHECK_THROWS_WITH_AS(mse_loss(x, constant(randn<float>({3, 2}, 103).to(test::gpu))),
                       doctest::Contains("mse_loss: pred has shape [2, 3] but target has shape [3, 2]"), Error);
  CHECK_THROWS_WITH_AS(softmax(x, 2),
                       doctest::Contains("softmax: axis 2 is out of range for shape [2, 3] of rank 2"), Error);
}

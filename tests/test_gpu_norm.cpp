// layernorm and rmsnorm on the GPU against the CPU in double (tests/gpu_reference.hpp), forward and every gradient:
// with and without beta, zero-centered gamma on and off, over hidden sizes that take each kernel path and row
// counts from none to many; rows padded past hidden (the launchers' ld); bitwise run-to-run determinism of the
// gradients; errors on the GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tapegrad/cuda/norm.hpp"
#include "gpu_reference.hpp"
#include "norm_cases.hpp"

using namespace tapegrad;
using test::GpuInput;
using test::Tolerance;
using namespace test::norm_cases;

namespace {

// v = {x, gamma, beta}; beta only for Kind::layernorm.
template <class U> Var<U> apply(Kind kind, const std::vector<Var<U>>& v, const NormOptions& options) {
  return apply(kind, v[0], v[1], v.size() > 2 ? v[2] : Var<U>(), options);
}

// x is drawn positive (|N(0,1)| + 0.5): rmsnorm of a one-element row x has dx ∝ epsilon / x³, so a tiny x makes the
// f32 result arbitrarily ill-conditioned; gamma and beta are N(0,1).
std::vector<GpuInput> norm_inputs(Kind kind, const Shape& x) {
  std::vector<GpuInput> in{{x, GpuInput::positive}, {{x.dim(-1)}}};
  if (kind == Kind::layernorm) in.push_back({{x.dim(-1)}});
  return in;
}

// Against the double reference on the same inputs, values of size up to ~20 (x̂ up to ~5 times gamma up to ~4):
// f64 differs only in summation order; f32 carries the f32 statistics over rows of up to 4099 elements (~1e-6
// relative) into those values, and dgamma/dbeta sum 1000 rows; bf16 and f16 are the result's rounding (at most an
// ulp when the f32 value lies near a rounding tie: 2⁻⁷ and 2⁻¹⁰ relative) above the f32 arithmetic.
template <class T> constexpr Tolerance tolerance{};
template <> constexpr Tolerance tolerance<double>{1e-9, 1e-9};
template <> constexpr Tolerance tolerance<float>{5e-5, 5e-5};
template <> constexpr Tolerance tolerance<bf16>{1e-2, 1e-4};
template <> constexpr Tolerance tolerance<f16>{2e-3, 1e-4};

// Hidden sizes and the path each takes: a warp per row up to 1024 elements, the block above; 16-byte packs where
// the size is a multiple of a pack (4 f32, 2 f64, 8 bf16/f16), single elements otherwise. Block rows of packs are
// held in registers up to 4 packs per thread (1024 packs), and read pass by pass beyond.
constexpr std::int64_t hidden_sizes[] = {
    1,     // warp, single elements
    7,     // warp, single elements
    33,    // warp, single elements, more than one element per lane
    64,    // warp, packs
    1000,  // warp, packs, several per lane
    1536,  // block, packs in registers (2 per thread)
    4096,  // block, packs in registers (4 per thread in f32, 2 in bf16/f16); f64 pass by pass
    4099,  // block, single elements
    8192,  // block, packs in registers in bf16/f16 (4 per thread); f32/f64 pass by pass
};
constexpr std::int64_t row_counts[] = {0, 1, 5, 1000};

}  // namespace

TEST_CASE_TEMPLATE("layernorm and rmsnorm on the GPU match the CPU, forward and every gradient",
                   T, TAPEGRAD_GPU_DTYPES) {
  std::uint64_t seed = 1;
  for (Kind kind : all_kinds) {
    for (bool zero_centered : {false, true}) {
      for (std::int64_t hidden : hidden_sizes) {
        for (std::int64_t rows : row_counts) {
          const Shape shape{rows, hidden};
          const std::string op = name(kind);
          CAPTURE(op);
          CAPTURE(zero_centered);
          CAPTURE(shape);
          const NormOptions options{.epsilon = 1e-5, .zero_centered_gamma = zero_centered};
          // A row of one element is x - mean = 0 exactly: dx is 0 in exact arithmetic, but the f32 rounding of its
          // terms (~1e-7) comes out multiplied by rstd = 1/sqrt(epsilon) ≈ 316.
          Tolerance tol = tolerance<T>;
          if (hidden == 1) tol.atol = std::max(tol.atol, 1e-3);
          const auto run = test::check_against_cpu<T>(
              op, [&](const auto& v) { return apply(kind, v, options); }, norm_inputs(kind, shape), tol, seed++);
          CHECK(run.y.shape() == shape);
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("norms on the GPU take a rank-3 x of many rows, and compute only the gradients asked", T, float,
                   bf16) {
  for (Kind kind : all_kinds) {
    const std::string op = name(kind);
    CAPTURE(op);
    // 20000 rows: the backward's blocks take 20 rows each (at most 1024 blocks).
    std::vector<GpuInput> inputs = norm_inputs(kind, {4, 5000, 33});
    test::check_against_cpu<T>(
        op, [&](const auto& v) { return apply(kind, v, {}); }, inputs, tolerance<T>, 50);
    // Each input in turn without a gradient (the kernels skip its computation): the others' stay right.
    for (std::size_t frozen = 0; frozen < inputs.size(); ++frozen) {
      CAPTURE(frozen);
      std::vector<GpuInput> some = inputs;
      some[frozen].requires_grad = false;
      test::check_against_cpu<T>(
          op, [&](const auto& v) { return apply(kind, v, {}); }, some, tolerance<T>, 60);
    }
  }
}

namespace {

// t [rows, cols] widened to [rows, ld], the new elements `fill`.
template <class T> Tensor<T> widened(const Tensor<T>& t, std::int64_t ld, T fill) {
  const std::int64_t rows = t.dim(0), cols = t.dim(1);
  Tensor<T> out(Shape{rows, ld});
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < ld; ++c) out.flat(r * ld + c) = c < cols ? t.flat(r * cols + c) : fill;
  }
  return out;
}

// The first `cols` of each row of t [rows, ld]; `padding_zeros` counts the other elements that are +0.
template <class T> Tensor<T> cropped(const Tensor<T>& t, std::int64_t cols, std::int64_t& padding_zeros) {
  const std::int64_t rows = t.dim(0), ld = t.dim(1);
  Tensor<T> out(Shape{rows, cols});
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < ld; ++c) {
      const T v = t.flat(r * ld + c);
      if (c < cols) out.flat(r * cols + c) = v;
      else padding_zeros += convert<double>(v) == 0.0 && !std::signbit(convert<double>(v));
    }
  }
  return out;
}

// The launchers on rows `ld` apart (x, dy and the backward's other rows padded with NaN, y and dx pre-filled with
// NaN), against the op on the CPU in double on the unpadded values, and other's column sums against sums in double;
// the padding of y and dx must come out +0. The partials' scratch starts `partials_offset` elements into its array
// (off 16 bytes, the partial sums are stored element by element).
template <class T> void check_padded_rows(Kind kind, std::int64_t rows, std::int64_t hidden, std::int64_t ld,
                                          std::uint64_t seed, std::int64_t partials_offset = 0) {
  CAPTURE(hidden);
  CAPTURE(ld);
  CAPTURE(partials_offset);
  const std::string op = name(kind);
  CAPTURE(op);
  const std::vector<GpuInput> inputs = norm_inputs(kind, {rows, hidden});
  std::vector<Tensor<T>> values;
  for (std::size_t k = 0; k < inputs.size(); ++k) values.push_back(test::draw_input<T>(inputs[k], seed + k));
  const Tensor<T> dy = randn<T>({rows, hidden}, seed + 10), other = randn<T>({rows, hidden}, seed + 11);
  Tensor<double> other_want = zeros<double>({hidden});
  for (std::int64_t i = 0; i < other.numel(); ++i) other_want.flat(i % hidden) += convert<double>(other.flat(i));
  const NormOptions options{.epsilon = 1e-5};
  const auto want = test::run_op<double, T>([&](const auto& v) { return apply(kind, v, options); }, inputs, values,
                                            &dy, Device::cpu(), 0);

  using C = compute_t<T>;
  const T nan = convert<T>(std::nan(""));
  const int device = test::gpu.index;
  const cuda::NormProblem problem{.dtype = dtype_v<T>, .rows = rows, .hidden = hidden, .ld = ld,
                                  .centered = kind != Kind::rmsnorm};
  const bool has_beta = kind == Kind::layernorm;
  const Tensor<T> x = widened(values[0], ld, nan).to(test::gpu), gamma = values[1].to(test::gpu);
  const Tensor<T> beta = has_beta ? values[2].to(test::gpu) : Tensor<T>();
  Tensor<T> y = full<T>({rows, ld}, std::nan(""), test::gpu), dx = full<T>({rows, ld}, std::nan(""), test::gpu);
  Tensor<C> mean({rows}, test::gpu), rstd({rows}, test::gpu);
  cuda::norm_forward(problem,
                     {.x = x.data(), .gamma = gamma.data(), .beta = has_beta ? beta.data() : nullptr, .y = y.data(),
                      .mean = mean.data(), .rstd = rstd.data(), .epsilon = options.epsilon},
                     device);
  Tensor<T> dgamma({hidden}, test::gpu), dbeta({hidden}, test::gpu), other_sums({hidden}, test::gpu);
  const Tensor<T> dy_rows = widened(dy, ld, nan).to(test::gpu), other_rows = widened(other, ld, nan).to(test::gpu);
  cuda::NormBackwardArgs args{.x = x.data(), .gamma = gamma.data(), .dy = dy_rows.data(), .mean = mean.data(),
                              .rstd = rstd.data(), .dx = dx.data(), .dgamma = dgamma.data(),
                              .dbeta = has_beta ? dbeta.data() : nullptr, .other = other_rows.data(),
                              .other_sums = other_sums.data()};
  Tensor<C> partials({cuda::norm_backward_partials(problem, args) + partials_offset}, test::gpu);
  args.partials = partials.data() + partials_offset;
  cuda::norm_backward(problem, args, device);
  std::int64_t padding_zeros = 0;
  test::check_close(cropped(y.to(Device::cpu()), hidden, padding_zeros), want.y, tolerance<T>);
  test::check_close(cropped(dx.to(Device::cpu()), hidden, padding_zeros), want.grads[0], tolerance<T>);
  CHECK(padding_zeros == 2 * rows * (ld - hidden));
  test::check_close(dgamma.to(Device::cpu()), want.grads[1], tolerance<T>);
  if (has_beta) test::check_close(dbeta.to(Device::cpu()), want.grads[2], tolerance<T>);
  test::check_close(other_sums.to(Device::cpu()), other_want, tolerance<T>);
}

}  // namespace

TEST_CASE_TEMPLATE("the GPU norm launchers take padded rows, write the padding as zeros, and sum other rows", T,
                   TAPEGRAD_GPU_DTYPES) {
  constexpr std::int64_t pack = 16 / sizeof(T);
  std::uint64_t seed = 200;
  for (Kind kind : all_kinds) {
    // A warp per row (7, 1021), the block with the row in registers (1539, 4093, 4096; f64 4093 and 4096 pass by
    // pass), the padding within the last pack, a whole pack more, or none (4096); and rows padded by a non-multiple
    // of the pack (single elements). Unpadded rows once more with the partials' scratch off 16 bytes.
    for (std::int64_t hidden : {std::int64_t{7}, std::int64_t{1021}, std::int64_t{1539}, std::int64_t{4093},
                                std::int64_t{4096}}) {
      const std::int64_t aligned = (hidden + pack - 1) / pack * pack;
      for (std::int64_t ld : {aligned, aligned + pack, hidden + 3}) {
        check_padded_rows<T>(kind, 37, hidden, ld, seed += 20);
      }
      if (hidden == aligned) check_padded_rows<T>(kind, 37, hidden, hidden, seed += 20, 1);
    }
  }
  const cuda::NormProblem short_rows{.dtype = dtype_v<T>, .rows = 2, .hidden = 8, .ld = 7};
  CHECK_THROWS_WITH_AS(cuda::norm_forward(short_rows, {}, test::gpu.index),
                       doctest::Contains("norm_forward: rows of 8 elements cannot lie 7 apart"), Error);
  const Tensor<T> rows = randn<T>({2, 8}, 300).to(test::gpu);
  const cuda::NormProblem problem{.dtype = dtype_v<T>, .rows = 2, .hidden = 8};
  CHECK_THROWS_WITH_AS(cuda::norm_backward(problem, {.other = rows.data()}, test::gpu.index),
                       doctest::Contains("norm_backward: other and other_sums come together (other is set, "
                                         "other_sums null)"),
                       Error);
}

TEST_CASE_TEMPLATE("the GPU norm gradients are bitwise the same on every run", T, float, bf16) {
  for (Kind kind : all_kinds) {
    // A warp per row; a block with the row in registers; a block pass by pass.
    for (std::int64_t hidden : {std::int64_t{1000}, std::int64_t{4096}, std::int64_t{4099}}) {
      const std::string op = name(kind);
      CAPTURE(op);
      CAPTURE(hidden);
      const std::vector<GpuInput> inputs = norm_inputs(kind, {1000, hidden});
      std::vector<Tensor<T>> values;
      for (std::size_t k = 0; k < inputs.size(); ++k) values.push_back(test::draw_input<T>(inputs[k], 70 + k));
      const auto f = [&](const auto& v) { return apply(kind, v, {}); };
      const auto first = test::run_op<T, T>(f, inputs, values, nullptr, test::gpu, 80);
      const auto second = test::run_op<T, T>(f, inputs, values, nullptr, test::gpu, 80);
      CHECK(test::bitwise_equal(first.y, second.y));
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        CAPTURE(k);
        CHECK(test::bitwise_equal(first.grads[k], second.grads[k]));
      }
    }
  }
}

TEST_CASE("layernorm on the GPU keeps the output and gradients on the GPU, in the input's dtype") {
  auto x = param(randn<bf16>({4, 33}, 90).to(test::gpu));
  auto gamma = param(randn<bf16>({33}, 91).to(test::gpu));
  auto beta = param(randn<bf16>({33}, 92).to(test::gpu));
  const Var<bf16> y = layernorm(x, gamma, beta);
  CHECK(y.device() == test::gpu);
  backward(y, ones<bf16>({4, 33}, test::gpu));
  for (const Var<bf16>* v : {&x, &gamma, &beta}) CHECK(v->grad().device() == test::gpu);
}

TEST_CASE("norm errors on the GPU name the op, the shapes and the devices") {
  const auto x = constant(randn<float>({3, 7}, 100).to(test::gpu));
  CHECK_THROWS_WITH_AS(layernorm(x, constant(randn<float>({5}, 101).to(test::gpu))),
                       doctest::Contains("layernorm: gamma has shape [5] but x has shape [3, 7]; expected gamma of "
                                         "shape [7] (x's last axis)"),
                       Error);
  CHECK_THROWS_WITH_AS(rmsnorm(x, constant(randn<float>({7}, 102))),
                       doctest::Contains("rmsnorm: input 0 is on cuda:0 but input 1 is on cpu"), Error);
  const auto gamma = constant(randn<float>({7}, 103).to(test::gpu));
  CHECK_THROWS_WITH_AS(layernorm(x, gamma, constant(randn<float>({7}, 104))),
                       doctest::Contains("layernorm: input 0 is on cuda:0 but input 2 is on cpu"), Error);
  CHECK_THROWS_WITH_AS(layernorm(x, gamma, {.epsilon = 0.0}),
                       doctest::Contains("layernorm: epsilon must be positive, got 0"), Error);
}

// The GPU's FP8 kernels. Quantization (cuda/fp8_quantize.hpp): amax, current scaling's scales, codes and their
// transpose bitwise the CPU's, for f32, bf16 and f16 inputs of odd sizes, in both formats, saturation included, and
// for every kind of f32 value (ties, specials); the activation kernels' own codes of a, dz and their transposes
// (delayed scaling's fused quantization) bitwise fp8_quantize's, and of a in 1×128 tiles fp8_block_quantize's; the
// amaxes that the norm and the activation's forward merge as they write their outputs (current scaling's)
// fp8_amax's of those outputs.
// The column sums the quantization adds up beside (a bias gradient) against sums in double.
// Products through cuBLASLt (cuda::gemm with GemmFp8): every pair of formats that Hopper multiplies, to bf16 (with
// and without a bias) and to f32 (without: refused with one), exact and fast accumulation, against the product of
// the same dequantized values in double; GELU in the epilogue written as codes (delayed scaling's forward), with
// its input and amax; the layouts, combinations and scale pointers that no FP8 kernel takes refused by name.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>

#include "fp8_sums.hpp"
#include "gpu_reference.hpp"
#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/cuda/fp8_block_quantize.hpp"
#include "tapegrad/cuda/fp8_quantize.hpp"
#include "tapegrad/cuda/mlp_activation.hpp"
#include "tapegrad/cuda/norm.hpp"
#include "tapegrad/cuda/partial_sums.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/activation_table.hpp"
#include "tapegrad/ops/fp8/detail/quantize.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::gpu;

namespace {

const Device host = Device::cpu();

// An fp8 operand: the codes of x · scale (current scaling), and the value each code stands for, code / scale.
template <class F> struct Operand {
  Tensor<F> codes;
  Tensor<double> values;
  float scale_inv;
};

template <class F> Operand<F> quantize(const Shape& shape, std::uint64_t seed) {
  Tensor<float> x = randn<float>(shape, seed, 0.0, 3.0);
  const float scale = fp8::current_scale(detail::amax_of(x), fp8::max_value<F::format>());
  for (std::int64_t i = 0; i < x.numel(); ++i) x.flat(i) *= scale;
  Operand<F> op{cast<F>(x), Tensor<double>(shape), 1.0f / scale};
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    op.values.flat(i) = convert<double>(op.codes.flat(i)) * static_cast<double>(op.scale_inv);
  }
  return op;
}

// C [M, N] = A [M, K] · Bᵀ (B stored [N, K]) + bias, in O, against double (tests/fp8_sums.hpp).
template <class FA, class FB, class O> void check_product(std::int64_t M, std::int64_t N, std::int64_t K, bool bias,
                                                          bool fast, std::uint64_t seed) {
  CAPTURE(M);
  CAPTURE(N);
  CAPTURE(K);
  CAPTURE(bias);
  CAPTURE(fast);
  INFO(dtype_name(dtype_v<FA>), " × ", dtype_name(dtype_v<FB>), " to ", dtype_name(dtype_v<O>));
  const Operand<FA> a = quantize<FA>({M, K}, seed);
  const Operand<FB> b = quantize<FB>({N, K}, seed + 1);
  const Tensor<O> bias_values = randn<O>({N}, seed + 2);
  const Tensor<FA> a_gpu = a.codes.to(gpu);
  const Tensor<FB> b_gpu = b.codes.to(gpu);
  const Tensor<O> bias_gpu = bias_values.to(gpu);
  const Tensor<float> a_scale_inv = full<float>({1}, a.scale_inv).to(gpu);
  const Tensor<float> b_scale_inv = full<float>({1}, b.scale_inv).to(gpu);
  Tensor<O> c_gpu(Shape{M, N}, gpu);
  const cuda::GemmFp8 fp8{.a = dtype_v<FA>,
                          .b = dtype_v<FB>,
                          .a_scale_inv = a_scale_inv.data(),
                          .b_scale_inv = b_scale_inv.data(),
                          .fast_accumulation = fast};
  const cuda::GemmArgs args{.dtype = dtype_v<O>,
                            .M = M,
                            .N = N,
                            .K = K,
                            .a = {a_gpu.data(), K, 0, false},
                            .b = {b_gpu.data(), K, 0, true},
                            .c = {c_gpu.data(), N, 0},
                            .bias = bias ? bias_gpu.data() : nullptr,
                            .fp8 = &fp8};
  REQUIRE_NOTHROW(cuda::gemm(args, 0));
  test::check_fp8_sums(
      c_gpu.to(host), M, N, K, [&](std::int64_t i, std::int64_t k) { return a.values.flat(i * K + k); },
      [&](std::int64_t j, std::int64_t k) { return b.values.flat(j * K + k); },
      [&](std::int64_t, std::int64_t j) { return bias ? convert<double>(bias_values.flat(j)) : 0.0; }, fast);
}

// x's column sums (a bias gradient) from the partial rows fp8_quantize wrote (column_partials), added by
// sum_partials, against the sums in double: within 4e-6 of Σ|x| down the column (f32 additions in a fixed order, no
// sum passing through more than ~60 roundings, each within 2^-24 of a partial sum no larger than Σ|x|).
template <class T> void check_column_sums(const Tensor<T>& x, const Tensor<float>& partials_gpu) {
  const std::int64_t rows = x.shape()[0], cols = x.shape()[1];
  REQUIRE(partials_gpu.shape() == Shape{cuda::fp8_column_partial_rows(rows), cols});
  Tensor<float> sums_gpu(Shape{cols}, gpu);
  const cuda::PartialSums sum{partials_gpu.data(), sums_gpu.data()};
  cuda::sum_partials(DType::f32, {&sum, 1}, partials_gpu.shape()[0], cols, 0);
  const Tensor<float> sums = sums_gpu.to(host);
  std::int64_t bad = 0;
  for (std::int64_t c = 0; c < cols; ++c) {
    double want = 0.0, size = 0.0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const double v = convert<double>(x.flat(r * cols + c));
      want += v;
      size += std::abs(v);
    }
    bad += !(std::abs(static_cast<double>(sums.flat(c)) - want) <= 4e-6 * size);
  }
  CHECK(bad == 0);
}

// Quantizes x [rows, cols] on the GPU with current scaling to F, into codes `padding` rows and columns larger, and
// checks every result against the CPU's: the amax (of fp8_amax, also from x's second element on, where its loads
// start off a 16-byte boundary, and of the quantization's own pass), the scales (made by the quantization from
// fp8_amax's), the codes and their transpose (its rows padded to a multiple of 16), zero codes past x, and x's column
// sums, which the same pass adds up.
template <class F, class T> void check_quantization(const Tensor<T>& x, std::int64_t padding = 0) {
  INFO(dtype_name(dtype_v<T>), " to ", dtype_name(dtype_v<F>), ", shape ", x.shape(), ", padded by ", padding);
  const std::int64_t x_rows = x.shape()[0], x_cols = x.shape()[1];
  const std::int64_t rows = x_rows + padding, cols = x_cols + padding, ld = (rows + 15) / 16 * 16;
  const float amax = detail::amax_of(x);
  float amax_past_first = 0.0f;
  for (std::int64_t i = 1; i < x.numel(); ++i) {
    amax_past_first = std::max(amax_past_first, std::abs(convert<float>(x.flat(i))));
  }
  const float scale = fp8::current_scale(amax, fp8::max_value<F::format>());
  const Tensor<T> x_gpu = x.to(gpu);
  Tensor<float> amax_gpu = zeros<float>({3}).to(gpu), scales_gpu(Shape{2}, gpu);
  Tensor<F> codes_gpu(Shape{rows, cols}, gpu), transposed_gpu(Shape{cols, ld}, gpu);
  Tensor<float> partials_gpu(Shape{cuda::fp8_column_partial_rows(x_rows), x_cols}, gpu);
  cuda::fp8_amax(dtype_v<T>, x_gpu.data(), x.numel(), amax_gpu.data(), 0);
  cuda::fp8_amax(dtype_v<T>, x_gpu.data() + 1, x.numel() - 1, amax_gpu.data() + 2, 0);
  const cuda::Fp8CurrentScale current{amax_gpu.data(), scales_gpu.data(), scales_gpu.data() + 1};
  cuda::fp8_quantize({.dtype = dtype_v<T>,
                      .x = x_gpu.data(),
                      .rows = x_rows,
                      .cols = x_cols,
                      .codes_rows = rows,
                      .codes_cols = cols,
                      .format = dtype_v<F>,
                      .current = &current,
                      .codes = codes_gpu.data(),
                      .transposed = transposed_gpu.data(),
                      .transposed_ld = ld,
                      .amax = amax_gpu.data() + 1,
                      .column_partials = partials_gpu.data()},
                     0);
  check_column_sums(x, partials_gpu);
  const Tensor<float> amaxes = amax_gpu.to(host);
  CHECK(amaxes.flat(0) == amax);
  CHECK(amaxes.flat(1) == amax);
  CHECK(amaxes.flat(2) == amax_past_first);
  const Tensor<float> scales = scales_gpu.to(host);
  CHECK(scales.flat(0) == scale);
  CHECK(scales.flat(1) == 1.0f / scale);
  const Tensor<F> codes = codes_gpu.to(host), transposed = transposed_gpu.to(host);
  std::int64_t bad = 0, bad_transposed = 0, bad_padding = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const bool in_x = r < x_rows && c < x_cols;
      const float scaled = in_x ? convert<float>(x.flat(r * x_cols + c)) * scale : 0.0f;
      const std::uint8_t want = fp8::from_double<F::format>(static_cast<double>(scaled));
      bad += codes.flat(r * cols + c).bits != want;
      bad_transposed += transposed.flat(c * ld + r).bits != want;
    }
  }
  for (std::int64_t c = 0; c < cols; ++c) {
    for (std::int64_t r = rows; r < ld; ++r) bad_padding += transposed.flat(c * ld + r).bits != 0;
  }
  CHECK(bad == 0);
  CHECK(bad_transposed == 0);
  CHECK(bad_padding == 0);
}

}  // namespace

TEST_CASE("fp8 quantization on the GPU gives the CPU's amax, scales, codes and transposed codes") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  // Whole runs of 8 (cols a multiple of 8) and single elements; tiles cut short in rows and columns.
  for (const Shape& shape : {Shape{1, 1}, Shape{37, 70}, Shape{256, 160}, Shape{33, 1}, Shape{1, 300}, Shape{40, 136},
                             Shape{200, 8}}) {
    Tensor<float> x = randn<float>(shape, seed, 0.0, 2.0);
    x.flat(0) = 0.0f;
    Tensor<float> spread = x.clone();  // values far below the scaled range: fp8's subnormals and zero
    for (std::int64_t i = 0; i < spread.numel(); ++i) spread.flat(i) *= std::exp2(static_cast<float>(i % 40 - 30));
    for (const Tensor<float>& t : {x, spread}) {
      check_quantization<f8e4m3>(t);
      check_quantization<f8e5m2>(t);
      check_quantization<f8e4m3>(cast<bf16>(t));
      check_quantization<f8e5m2>(cast<f16>(t));
    }
    // Into padded codes (a weight's, made without a padded copy): whole runs of x become partial ones of the codes.
    check_quantization<f8e4m3>(cast<bf16>(x), 3);
    check_quantization<f8e4m3>(x, 16);
  }
  // Long runs (the amax's packs, and a grid that strides), every start off a 16-byte boundary.
  for (const std::int64_t n : {std::int64_t{1} << 22, std::int64_t{100003}}) {
    const Tensor<bf16> x = randn<bf16>({n}, seed, 0.0, 1.0);
    const Tensor<bf16> x_gpu = x.to(gpu);
    for (std::int64_t offset = 0; offset < 8; ++offset) {
      CAPTURE(n);
      CAPTURE(offset);
      float want = 0.0f;
      for (std::int64_t i = offset; i < n - 3; ++i) want = std::max(want, std::abs(convert<float>(x.flat(i))));
      Tensor<float> amax = zeros<float>({1}).to(gpu);
      cuda::fp8_amax(DType::bf16, x_gpu.data() + offset, n - 3 - offset, amax.data(), 0);
      CHECK(amax.to(host).flat(0) == want);
    }
  }
  // Current scaling of no elements: the scale is still written (1, an amax of 0's).
  const Tensor<float> no_amax = zeros<float>({1}).to(gpu);
  Tensor<float> made = full<float>({2}, NAN).to(gpu);
  const cuda::Fp8CurrentScale from_no_amax{no_amax.data(), made.data(), made.data() + 1};
  cuda::fp8_quantize({.rows = 0, .cols = 8, .current = &from_no_amax}, 0);
  CHECK(made.to(host).flat(0) == 1.0f);
  CHECK(made.to(host).flat(1) == 1.0f);
  // A delayed scale below the tensor's own: saturation to the largest finite code (the GPU uses the CPU's scale).
  const Tensor<float> x = randn<float>({8, 8}, seed, 0.0, 100.0);
  const Tensor<float> x_gpu = x.to(gpu), scale = full<float>({1}, 16.0).to(gpu);
  Tensor<f8e4m3> codes_gpu(Shape{8, 8}, gpu);
  cuda::fp8_quantize({.x = x_gpu.data(), .rows = 8, .cols = 8, .scale = scale.data(), .codes = codes_gpu.data()}, 0);
  const Tensor<f8e4m3> codes = codes_gpu.to(host);
  for (std::int64_t i = 0; i < 64; ++i) {
    CHECK(codes.flat(i).bits == fp8::from_double<fp8::Format::e4m3>(static_cast<double>(x.flat(i) * 16.0f)));
  }
  CHECK_THROWS_WITH_AS(cuda::fp8_quantize({.dtype = DType::f64, .x = x.data(), .rows = 8, .cols = 8}, 0),
                       doctest::Contains("fp8_quantize: quantizes f32, bf16 or f16, not f64"), Error);
  CHECK_THROWS_WITH_AS(cuda::fp8_quantize({.x = x.data(), .rows = 8, .cols = 8, .format = DType::bf16}, 0),
                       doctest::Contains("the format must be f8e4m3 or f8e5m2, got bf16"), Error);
  const cuda::Fp8CurrentScale nowhere{no_amax.data()};
  CHECK_THROWS_WITH_AS(cuda::fp8_quantize({.x = x.data(), .rows = 8, .cols = 8, .current = &nowhere}, 0),
                       doctest::Contains("fp8_quantize: current scaling needs an amax to make the scale from"),
                       Error);
}

// Quantizes x [rows, cols] over itself (fp8_quantize_over) to F at a scale of the tensor's amax and checks each row's
// first cols bytes against the CPU's codes.
// x quantized over itself at a given scale (its amax merged into one that starts at 0.5), and with current scaling's
// scale made by the kernel from x's amax; the codes are fp8_quantize's, the amax and the scales the CPU's.
template <class F, class T> void check_quantization_over(const Tensor<T>& x) {
  INFO(dtype_name(dtype_v<T>), " to ", dtype_name(dtype_v<F>), " over itself, shape ", x.shape());
  const std::int64_t rows = x.shape()[0], cols = x.shape()[1], ld = cols * std::int64_t{sizeof(T)};
  const float amax = detail::amax_of(x), scale = fp8::current_scale(amax, fp8::max_value<F::format>());
  for (const bool current : {false, true}) {
    CAPTURE(current);
    Tensor<T> x_gpu = x.to(gpu);
    // [given scale, amax accumulator, current's amax, its scale, its scale_inv]
    Tensor<float> scalars = from_vector<float>({scale, 0.5f, amax, 0.0f, 0.0f}, Shape{5}).to(gpu);
    const cuda::Fp8CurrentScale made{scalars.data() + 2, scalars.data() + 3, scalars.data() + 4};
    cuda::fp8_quantize_over({.dtype = dtype_v<T>,
                             .x = x_gpu.data(),
                             .rows = rows,
                             .cols = cols,
                             .format = dtype_v<F>,
                             .scale = current ? nullptr : scalars.data(),
                             .current = current ? &made : nullptr,
                             .amax = current ? nullptr : scalars.data() + 1},
                            0);
    const Tensor<T> over = x_gpu.to(host);
    const Tensor<float> out = scalars.to(host);
    if (current) {
      CHECK(out.flat(3) == scale);
      CHECK(out.flat(4) == 1.0f / scale);
    } else {
      CHECK(out.flat(1) == std::max(amax, 0.5f));
    }
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(over.data());
    std::int64_t bad = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        const double scaled = static_cast<double>(convert<float>(x.flat(r * cols + c)) * scale);
        bad += bytes[r * ld + c] != fp8::from_double<F::format>(scaled);
      }
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("fp8 quantization's column sums of a tensor of more tiles than blocks are its column sums") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  // 257 × 17 tiles of 64 × 64 (the last row of tiles cut short): blocks take many tiles each, their runs copied
  // ahead; the codes are the CPU's.
  constexpr std::int64_t rows = 16400, cols = 1032;
  const Tensor<bf16> x = randn<bf16>({rows, cols}, seed, 0.5, 2.0);
  const Tensor<bf16> x_gpu = x.to(gpu);
  const Tensor<float> scale = full<float>({1}, 4.0f).to(gpu);
  Tensor<f8e5m2> codes_gpu(Shape{rows, cols}, gpu);
  Tensor<float> partials_gpu(Shape{cuda::fp8_column_partial_rows(rows), cols}, gpu);
  cuda::fp8_quantize({.dtype = DType::bf16,
                      .x = x_gpu.data(),
                      .rows = rows,
                      .cols = cols,
                      .format = DType::f8e5m2,
                      .scale = scale.data(),
                      .codes = codes_gpu.data(),
                      .column_partials = partials_gpu.data()},
                     0);
  check_column_sums(x, partials_gpu);
  const Tensor<f8e5m2> codes = codes_gpu.to(host);
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    bad += codes.flat(i).bits != fp8::from_double<fp8::Format::e5m2>(4.0 * convert<double>(x.flat(i)));
  }
  CHECK(bad == 0);
}

TEST_CASE("fp8 codes written over their own values are fp8_quantize's codes, rows a row's bytes apart") {
  // (current scaling's scale made by the kernel, delayed scaling's amax merged by it)
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  // One run; a row of one chunk cut short, of several chunks and a part; more rows than the grid's blocks (it strides).
  for (const Shape& shape : {Shape{1, 8}, Shape{37, 136}, Shape{5, 22016}, Shape{3, 6152}, Shape{9000, 16}}) {
    const Tensor<float> x = randn<float>(shape, seed, 0.0, 2.0);
    check_quantization_over<f8e4m3>(x);
    check_quantization_over<f8e5m2>(x);
    check_quantization_over<f8e4m3>(cast<bf16>(x));
    check_quantization_over<f8e5m2>(cast<bf16>(x));
    check_quantization_over<f8e4m3>(cast<f16>(x));
  }
  Tensor<float> x = zeros<float>({2, 12}).to(gpu);
  const Tensor<float> scale = full<float>({1}, 1.0).to(gpu);
  CHECK_THROWS_WITH_AS(cuda::fp8_quantize_over({.x = x.data(), .rows = 2, .cols = 12, .scale = scale.data()}, 0),
                       doctest::Contains("fp8_quantize_over: quantizes rows of a multiple of 8 elements"), Error);
  CHECK_THROWS_WITH_AS(cuda::fp8_quantize_over({.x = x.data(), .rows = 2, .cols = 8}, 0),
                       doctest::Contains("fp8_quantize_over: needs the scale to quantize by"), Error);
}

TEST_CASE("fp8 codes transposed from codes are the codes moved, zero past the rows") {
  std::mt19937 bits(test::fresh_seed());
  // (rows, cols, the codes' row stride, the transpose's): aligned and not, whole tiles and ragged edges, and more
  // tiles than the grid's blocks (each block's next tile loaded while it writes the last)
  for (const auto [rows, cols, ld, transposed_ld] : {std::array<std::int64_t, 4>{64, 64, 64, 64},
                                                     std::array<std::int64_t, 4>{130, 200, 400, 144},
                                                     std::array<std::int64_t, 4>{37, 13, 13, 48},
                                                     std::array<std::int64_t, 4>{1000, 24, 48, 1008},
                                                     std::array<std::int64_t, 4>{8200, 4104, 4104, 8208}}) {
    CAPTURE(rows);
    CAPTURE(cols);
    Tensor<f8e4m3> codes(Shape{rows * ld});
    for (std::int64_t i = 0; i < codes.numel(); ++i) codes.flat(i) = f8e4m3{static_cast<std::uint8_t>(bits())};
    const Tensor<f8e4m3> codes_gpu = codes.to(gpu);
    Tensor<f8e4m3> transposed_gpu(Shape{cols * transposed_ld});  // (nonzero before: the padding must be written)
    for (std::int64_t i = 0; i < transposed_gpu.numel(); ++i) transposed_gpu.flat(i) = f8e4m3{0x11};
    transposed_gpu = transposed_gpu.to(gpu);
    cuda::fp8_transpose(codes_gpu.data(), rows, cols, ld, transposed_gpu.data(), transposed_ld, 0);
    const Tensor<f8e4m3> transposed = transposed_gpu.to(host);
    std::int64_t bad = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      for (std::int64_t r = 0; r < transposed_ld; ++r) {
        const std::uint8_t want = r < rows ? codes.flat(r * ld + c).bits : 0;
        bad += transposed.flat(c * transposed_ld + r).bits != want;
      }
    }
    CHECK(bad == 0);
  }
  CHECK_THROWS_WITH_AS(cuda::fp8_transpose(nullptr, 8, 8, 4, nullptr, 8, 0),
                       doctest::Contains("fp8_transpose: codes [8, 8] with rows 4 bytes apart"), Error);
}

TEST_CASE("every kind of f32 value quantizes on the GPU to the CPU's code") {
  // Random bit patterns (every exponent: normals, subnormals of f32 and of fp8, values that saturate), the values
  // halfway between neighbouring codes (ties) and next to them, ±0, ±infinity and NaNs; scale 1.
  std::mt19937 bits(test::fresh_seed());
  Tensor<float> x({1024, 256});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.flat(i) = std::bit_cast<float>(static_cast<std::uint32_t>(bits()));
  std::int64_t at = 0;
  for (float special : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 448.0f, 464.0f, 480.0f, 57344.0f, 61440.0f}) {
    x.flat(at++) = special;
  }
  const auto halfway = [](auto to_float, int code) { return (to_float(code) + to_float(code + 1)) / 2; };
  for (int code = 0; code < 127; ++code) {  // e4m3's and e5m2's halfway points and their neighbours
    for (const float mid : {halfway(fp8::to_float<fp8::Format::e4m3>, code),
                            halfway(fp8::to_float<fp8::Format::e5m2>, code)}) {
      for (const float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
        x.flat(at++) = v;
        x.flat(at++) = -v;
      }
    }
  }
  const Tensor<float> x_gpu = x.to(gpu), one = full<float>({1}, 1.0).to(gpu);
  Tensor<f8e4m3> e4m3_gpu(x.shape(), gpu);
  Tensor<f8e5m2> e5m2_gpu(x.shape(), gpu);
  for (auto [format, codes] : {std::pair<DType, void*>{DType::f8e4m3, e4m3_gpu.data()},
                               std::pair<DType, void*>{DType::f8e5m2, e5m2_gpu.data()}}) {
    cuda::fp8_quantize({.x = x_gpu.data(), .rows = 1024, .cols = 256, .format = format, .scale = one.data(),
                        .codes = codes},
                       0);
  }
  const Tensor<f8e4m3> e4m3 = e4m3_gpu.to(host);
  const Tensor<f8e5m2> e5m2 = e5m2_gpu.to(host);
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    bad += e4m3.flat(i).bits != fp8::from_double<fp8::Format::e4m3>(x.flat(i));
    bad += e5m2.flat(i).bits != fp8::from_double<fp8::Format::e5m2>(x.flat(i));
  }
  CHECK(bad == 0);
}

TEST_CASE("the activation kernel's fp8 codes of a are fp8_quantize's codes of its a, with the same amax as its a's") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  for (Activation activation : {Activation::gelu, Activation::swiglu, Activation::squared_relu}) {
    const ActivationForm form = detail::mlp::activation_form({.activation = activation});
    // F 136: whole packs; 37: single elements.
    for (const std::int64_t F : {std::int64_t{136}, std::int64_t{37}}) {
      CAPTURE(F);
      const std::int64_t rows = 45, width = activation_width(activation);
      const Tensor<bf16> z = randn<bf16>({rows, width * F}, seed, 0.0, 2.0).to(gpu);
      const Tensor<float> scale = full<float>({1}, 3.5).to(gpu);
      Tensor<bf16> a(Shape{rows, F}, gpu);
      Tensor<f8e4m3> fused(Shape{rows, F}, gpu), separate(Shape{rows, F}, gpu);
      Tensor<float> amax = zeros<float>({3}).to(gpu);  // fp8_quantize's, the fused codes', the values'
      cuda::mlp_activation_forward(DType::bf16, 0, form, z.data(), a.data(), rows, F, nullptr, amax.data() + 2);
      cuda::fp8_quantize({.dtype = DType::bf16, .x = a.data(), .rows = rows, .cols = F, .scale = scale.data(),
                          .codes = separate.data(), .amax = amax.data()},
                         0);
      const cuda::ActivationCodes codes{fused.data(), scale.data()};
      cuda::mlp_activation_forward(DType::bf16, 0, form, z.data(), nullptr, rows, F, &codes, amax.data() + 1);
      CHECK(test::bitwise_equal(fused.to(host), separate.to(host)));
      const Tensor<float> amaxes = amax.to(host);
      CHECK(amaxes.flat(0) == amaxes.flat(1));
      CHECK(amaxes.flat(0) == amaxes.flat(2));
      CHECK(amaxes.flat(0) > 0.0f);
    }
  }
}

TEST_CASE("the activation kernel's codes of a in 1x128 tiles are fp8_block_quantize's of its a, scales too") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  for (Activation activation : {Activation::gelu, Activation::swiglu}) {
    const ActivationForm form = detail::mlp::activation_form({.activation = activation});
    const std::int64_t width = activation_width(activation);
    // F 384: the last tile in half of a warp whose other half is past F (bf16); 1024: several blocks' worth in f32.
    for (const std::int64_t F : {std::int64_t{384}, std::int64_t{1024}}) {
      for (const bool f32 : {false, true}) {
        CAPTURE(F);
        CAPTURE(f32);
        const std::int64_t rows = 44;
        Tensor<float> z_host = randn<float>({rows, width * F}, seed, 0.0, 2.0);
        for (std::int64_t c = 0; c < 128; ++c) z_host.flat(3 * width * F + 128 + c) *= 1e-3f;  // a tile of small values
        z_host.flat(5 * width * F + 7) = INFINITY;  // a tile holding an infinity: its scale's inverse is NaN
        const DType dtype = f32 ? DType::f32 : DType::bf16;
        const Tensor<float> z32 = z_host.to(gpu);
        const Tensor<bf16> z16 = cast<bf16>(z_host).to(gpu);
        const void* z = f32 ? static_cast<const void*>(z32.data()) : static_cast<const void*>(z16.data());
        Tensor<float> a32(Shape{rows, F}, gpu);
        Tensor<bf16> a16(Shape{rows, F}, gpu);
        void* a = f32 ? static_cast<void*>(a32.data()) : static_cast<void*>(a16.data());
        const std::int64_t scale_count = cuda::fp8_scale_shape(cuda::Fp8Scaling::tiles_1x128, rows, F).count();
        Tensor<f8e4m3> fused(Shape{rows, F}, gpu), separate(Shape{rows, F}, gpu);
        Tensor<float> fused_scales = full<float>({scale_count}, -1.0).to(gpu), separate_scales(Shape{scale_count}, gpu);
        cuda::mlp_activation_forward(dtype, 0, form, z, a, rows, F);
        cuda::fp8_block_quantize({.dtype = dtype, .x = a, .rows = rows, .cols = F, .codes = separate.data(),
                                  .scales = separate_scales.data()},
                                 0);
        const cuda::ActivationCodes codes{.codes = fused.data(), .tile_scales = fused_scales.data()};
        cuda::mlp_activation_forward(dtype, 0, form, z, nullptr, rows, F, &codes);
        CHECK(test::bitwise_equal(fused.to(host), separate.to(host)));
        CHECK(test::bitwise_equal(fused_scales.to(host), separate_scales.to(host)));
      }
    }
  }
  const Tensor<bf16> z(Shape{6, 128}, gpu);
  Tensor<f8e4m3> codes(Shape{6, 128}, gpu);
  Tensor<float> scales(Shape{8}, gpu);
  const cuda::ActivationCodes tiled{.codes = codes.data(), .tile_scales = scales.data()};
  CHECK_THROWS_WITH_AS(
      cuda::mlp_activation_forward(DType::bf16, 0, detail::mlp::activation_form({}), z.data(), nullptr, 6, 128, &tiled),
      doctest::Contains("codes in 1x128 tiles need F (128) in whole tiles, rows (6) a multiple of 4"), Error);
}

TEST_CASE("the fused backward's codes of dz and a are fp8_quantize's codes of the plain backward's, its dz the plain "
          "dz, and db1 its sum") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  for (Activation activation : {Activation::gelu, Activation::swiglu, Activation::squared_relu,
                                Activation::clamped_swiglu}) {
    const ActivationForm form = detail::mlp::activation_form({.activation = activation});
    const std::int64_t width = activation_width(activation);
    // 45 rows: a transpose padded to 48, tiles cut short; 272 rows, F 80: several tiles and chunks each way; 2568
    // rows, F 4096: chunks of two tiles, the last tile cut short.
    for (const auto& [rows, F] :
         {std::pair<std::int64_t, std::int64_t>{45, 144}, {272, 80}, {2568, 4096}, {0, 16}}) {
      for (const DType dz_format : {DType::f8e5m2, DType::f8e4m3}) {
        for (const bool every_layout : {true, false}) {  // false: dz's codes alone, no transposes
          CAPTURE(rows);
          CAPTURE(F);
          CAPTURE(every_layout);
          const std::int64_t ld = (rows + 15) / 16 * 16;
          const Tensor<bf16> z = randn<bf16>({rows, width * F}, seed, 0.0, 2.0).to(gpu);
          const Tensor<bf16> da = randn<bf16>({rows, F}, seed + 1, 0.0, 1.0).to(gpu);
          const Tensor<float> scales = from_vector<float>({24.0f, 40.0f}, {2}).to(gpu);  // dz's, a's
          const float* dz_scale = scales.data();
          const float* a_scale = scales.data() + 1;
          // The plain backward, then fp8_quantize of its dz and a.
          Tensor<bf16> dz(Shape{rows, width * F}, gpu), a(Shape{rows, F}, gpu);
          Tensor<float> db1(Shape{width * F}, gpu), amax = zeros<float>({3}).to(gpu);
          Tensor<float> partials(Shape{std::max<std::int64_t>(1, cuda::mlp_activation_partials(rows, F, width))}, gpu);
          cuda::mlp_activation_backward(DType::bf16, 0, form, z.data(), da.data(),
                                        {.dz = dz.data(), .a = a.data(), .dbias = db1.data(),
                                         .partials = partials.data(), .wide_dbias = true},
                                        rows, F);
          // The codes of either format, as bytes of f8e4m3 tensors.
          Tensor<f8e4m3> dz_codes(Shape{rows, width * F}, gpu), dz_t(Shape{width * F, ld}, gpu), a_t(Shape{F, ld}, gpu);
          cuda::fp8_quantize({.dtype = DType::bf16, .x = dz.data(), .rows = rows, .cols = width * F,
                              .format = dz_format, .scale = dz_scale, .codes = dz_codes.data(),
                              .transposed = dz_t.data(), .transposed_ld = ld, .amax = amax.data()},
                             0);
          cuda::fp8_quantize({.dtype = DType::bf16, .x = a.data(), .rows = rows, .cols = F, .scale = a_scale,
                              .transposed = a_t.data(), .transposed_ld = ld},
                             0);
          // The fused backward; its outputs start as NaN codes, so that a code it leaves unwritten shows.
          const auto filled = [](const Shape& shape) { return cast<f8e4m3>(full<float>(shape, NAN)).to(gpu); };
          Tensor<f8e4m3> fused_codes = filled({rows, width * F}), fused_dz_t = filled({width * F, ld}),
                         fused_a_t = filled({F, ld});
          Tensor<float> fused_db1(Shape{width * F}, gpu);
          Tensor<float> fused_partials(
              Shape{std::max<std::int64_t>(1, cuda::mlp_activation_codes_partials(rows, F, width))}, gpu);
          cuda::mlp_activation_backward_codes(DType::bf16, 0, form, z.data(), da.data(),
                                              {.dz_format = dz_format,
                                               .dz_scale = dz_scale,
                                               .dz_codes = fused_codes.data(),
                                               .dz_transposed = every_layout ? fused_dz_t.data() : nullptr,
                                               .dz_amax = amax.data() + 1,
                                               .a_scale = a_scale,
                                               .a_transposed = every_layout ? fused_a_t.data() : nullptr,
                                               .transposed_ld = ld,
                                               .dbias = fused_db1.data(),
                                               .partials = fused_partials.data(),
                                               .wide_dbias = true},
                                              rows, F);
          CHECK(test::bitwise_equal(fused_codes.to(host), dz_codes.to(host)));
          if (every_layout) {
            CHECK(test::bitwise_equal(fused_dz_t.to(host), dz_t.to(host)));
            CHECK(test::bitwise_equal(fused_a_t.to(host), a_t.to(host)));
          }
          // The same over two parts of the rows, as layernorm_mlp's backward takes them (the first of whole 64-row
          // tiles): each call from its part's first row of z, da and dz's codes and its first column of the
          // transposes, the parts' partials side by side and summed after.
          Tensor<f8e4m3> split_codes = filled({rows, width * F}), split_dz_t = filled({width * F, ld}),
                         split_a_t = filled({F, ld});
          const std::int64_t split = rows >= 128 ? (rows / 2 + 63) / 64 * 64 : rows;
          const std::int64_t split_partials_size = cuda::mlp_activation_codes_partials(split, F, width) +
                                                   cuda::mlp_activation_codes_partials(rows - split, F, width);
          Tensor<float> split_partials(Shape{std::max<std::int64_t>(1, split_partials_size)}, gpu);
          Tensor<float> split_db1(Shape{width * F}, gpu);
          std::int64_t partials_at = 0;
          for (const auto& [first, count] : {std::pair{std::int64_t{0}, split}, std::pair{split, rows - split}}) {
            if (count == 0) continue;
            cuda::mlp_activation_backward_codes(
                DType::bf16, 0, form, z.data() + first * width * F, da.data() + first * F,
                {.dz_format = dz_format,
                 .dz_scale = dz_scale,
                 .dz_codes = split_codes.data() + first * width * F,
                 .dz_transposed = every_layout ? split_dz_t.data() + first : nullptr,
                 .a_scale = a_scale,
                 .a_transposed = every_layout ? split_a_t.data() + first : nullptr,
                 .transposed_ld = ld,
                 .partials = split_partials.data() + partials_at},
                count, F);
            partials_at += cuda::mlp_activation_codes_partials(count, F, width);
          }
          const cuda::PartialSums split_sums{split_partials.data(), split_db1.data()};
          cuda::sum_partials(DType::f32, {&split_sums, 1}, split_partials_size / (width * F), width * F, 0);
          CHECK(test::bitwise_equal(split_codes.to(host), dz_codes.to(host)));
          if (every_layout) {
            CHECK(test::bitwise_equal(split_dz_t.to(host), dz_t.to(host)));
            CHECK(test::bitwise_equal(split_a_t.to(host), a_t.to(host)));
          }
          // Current scaling's form: dz as values written over z (here a copy of it), its amax, a's transpose.
          Tensor<bf16> dz_over_z = z.clone();
          Tensor<f8e4m3> values_a_t = filled({F, ld});
          cuda::mlp_activation_backward_codes(DType::bf16, 0, form, dz_over_z.data(), da.data(),
                                              {.dz = dz_over_z.data(),
                                               .dz_amax = amax.data() + 2,
                                               .a_scale = a_scale,
                                               .a_transposed = values_a_t.data(),
                                               .transposed_ld = ld},
                                              rows, F);
          CHECK(test::bitwise_equal(dz_over_z.to(host), dz.to(host)));
          CHECK(test::bitwise_equal(values_a_t.to(host), a_t.to(host)));
          const Tensor<float> amaxes = amax.to(host);
          CHECK(amaxes.flat(0) == amaxes.flat(1));
          CHECK(amaxes.flat(0) == amaxes.flat(2));
          // db1, whole and split: the same dz summed in other orders (f32): within f32's rounding of the sum of |dz|.
          const Tensor<bf16> dz_host = dz.to(host);
          const Tensor<float> expected = db1.to(host), got = fused_db1.to(host), got_split = split_db1.to(host);
          for (std::int64_t j = 0; j < width * F; ++j) {
            double magnitude = 0;
            for (std::int64_t r = 0; r < rows; ++r) magnitude += std::abs(static_cast<double>(dz_host.flat(r * width * F + j)));
            CHECK(std::abs(static_cast<double>(got.flat(j)) - expected.flat(j)) <= 1e-6 * magnitude);
            CHECK(std::abs(static_cast<double>(got_split.flat(j)) - expected.flat(j)) <= 1e-6 * magnitude);
          }
        }
      }
    }
  }
  const Tensor<bf16> z(Shape{4, 24}, gpu);
  const Tensor<float> scale = full<float>({1}, 1.0).to(gpu);
  CHECK_THROWS_WITH_AS(cuda::mlp_activation_backward_codes(DType::bf16, 0, detail::mlp::activation_form({}), z.data(),
                                                           z.data(), {.dz_scale = scale.data()}, 4, 24),
                       doctest::Contains("the fused backward needs F (24) in a multiple of 16"), Error);
}

TEST_CASE("the norm's amax of y is fp8_amax's of its y, in every kernel and with padded rows") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  // hidden 200: a warp a row; 3000 (padded to 3008): rows held in registers; 9000: a block a row, in 8 passes.
  for (const auto& [hidden, ld] : {std::pair<std::int64_t, std::int64_t>{200, 200}, {3000, 3008}, {9000, 9000}}) {
    for (const bool centered : {true, false}) {
      CAPTURE(hidden);
      CAPTURE(centered);
      const std::int64_t rows = 37;
      const Tensor<bf16> x = randn<bf16>({rows, ld}, seed, 1.0, 3.0).to(gpu);
      const Tensor<bf16> gamma = randn<bf16>({hidden}, seed + 1).to(gpu);
      const Tensor<bf16> beta = randn<bf16>({hidden}, seed + 2).to(gpu);
      Tensor<bf16> y(Shape{rows, ld}, gpu);
      Tensor<float> amax = zeros<float>({2}).to(gpu);
      cuda::norm_forward({.dtype = DType::bf16, .rows = rows, .hidden = hidden, .ld = ld, .centered = centered},
                         {.x = x.data(), .gamma = gamma.data(), .beta = beta.data(), .y = y.data(),
                          .amax = amax.data()},
                         0);
      cuda::fp8_amax(DType::bf16, y.data(), y.numel(), amax.data() + 1, 0);
      const Tensor<float> amaxes = amax.to(host);
      CHECK(amaxes.flat(0) == amaxes.flat(1));
      CHECK(amaxes.flat(0) > 1.0f);
    }
  }
}

TEST_CASE("fp8 products through cuBLASLt are the products of the dequantized operands") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  for (const auto [M, N, K] : {std::array<std::int64_t, 3>{16, 16, 16}, {64, 64, 64}, {64, 48, 96}, {200, 144, 512},
                               {37, 16, 16}}) {
    for (bool bias : {false, true}) {
      for (bool fast : {false, true}) {
        check_product<f8e4m3, f8e4m3, bf16>(M, N, K, bias, fast, seed);
        if (!bias) check_product<f8e4m3, f8e4m3, float>(M, N, K, false, fast, seed);
        check_product<f8e5m2, f8e4m3, bf16>(M, N, K, bias, fast, seed);
        check_product<f8e4m3, f8e5m2, bf16>(M, N, K, bias, fast, seed);
      }
    }
  }
}

TEST_CASE("an fp8 product's GELU epilogue writes its sum, GELU's codes at the scale given and their amax") {
  // The reference: the same product in f32 (no epilogue), the bias and GELU (tanh) added here in double. The epilogue
  // takes GELU of the unrounded sum; its sum and GELU may differ from these in the last bits: z within one bf16 step,
  // each code within one fp8 step of the reference's value, the amax within 1e-3. A's scale is cut by 32 to bring the
  // sums into GELU's curved range, with codes unsaturated.
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  for (const auto [M, N, K] : {std::array<std::int64_t, 3>{64, 48, 96}, {37, 272, 64}}) {
    CAPTURE(M);
    CAPTURE(N);
    const Operand<f8e4m3> a = quantize<f8e4m3>({M, K}, seed);
    const Operand<f8e4m3> b = quantize<f8e4m3>({N, K}, seed + 1);
    const Tensor<bf16> bias = randn<bf16>({N}, seed + 2);
    const Tensor<f8e4m3> a_gpu = a.codes.to(gpu), b_gpu = b.codes.to(gpu);
    const Tensor<bf16> bias_gpu = bias.to(gpu);
    const Tensor<float> a_scale_inv = full<float>({1}, a.scale_inv / 32).to(gpu);
    const Tensor<float> b_scale_inv = full<float>({1}, b.scale_inv).to(gpu);
    const float scale = 3.5f;
    const Tensor<float> scale_gpu = full<float>({1}, scale).to(gpu);
    Tensor<float> amax_gpu = zeros<float>({1}).to(gpu), sums_gpu(Shape{M, N}, gpu);
    Tensor<bf16> z_gpu(Shape{M, N}, gpu);
    Tensor<f8e4m3> codes_gpu(Shape{M, N}, gpu);
    cuda::GemmFp8 fp8{.a_scale_inv = a_scale_inv.data(), .b_scale_inv = b_scale_inv.data()};
    cuda::GemmArgs args{.dtype = DType::f32,
                        .M = M,
                        .N = N,
                        .K = K,
                        .a = {a_gpu.data(), K, 0, false},
                        .b = {b_gpu.data(), K, 0, true},
                        .c = {sums_gpu.data(), N, 0},
                        .fp8 = &fp8};
    cuda::gemm(args, 0);
    fp8.c_codes = DType::f8e4m3;
    fp8.c_scale = scale_gpu.data();
    fp8.c_amax = amax_gpu.data();
    args.dtype = DType::bf16;
    args.c.data = codes_gpu.data();
    args.bias = bias_gpu.data();
    args.gelu_input = z_gpu.data();
    REQUIRE_NOTHROW(cuda::gemm(args, 0));
    const Tensor<float> sums = sums_gpu.to(host);
    const Tensor<bf16> z = z_gpu.to(host);
    const Tensor<f8e4m3> codes = codes_gpu.to(host);
    double amax = 0;
    std::int64_t far_z = 0, far_codes = 0, other_codes = 0;
    for (std::int64_t i = 0; i < M * N; ++i) {
      const double sum = double(sums.flat(i)) + convert<double>(bias.flat(i % N));
      const double gelu = 0.5 * sum * (1 + std::tanh(0.7978845608028654 * (sum + 0.044715 * sum * sum * sum)));
      amax = std::max(amax, std::abs(gelu));
      far_z += std::abs(convert<double>(z.flat(i)) - sum) > std::abs(sum) / 128 + 1e-6;
      const double want = gelu * scale, got = convert<double>(codes.flat(i));
      far_codes += std::abs(got - want) > std::abs(want) / 8 + 1.0 / 512;  // one e4m3 step; subnormals 2^-9 apart
      other_codes += double(fp8::to_float<fp8::Format::e4m3>(fp8::from_double<fp8::Format::e4m3>(want))) != got;
    }
    CHECK(far_z == 0);
    CHECK(far_codes == 0);
    CHECK(other_codes <= M * N / 20);
    CHECK(amax_gpu.to(host).flat(0) == doctest::Approx(amax).epsilon(1e-3));
  }
}

TEST_CASE("fp8 operands that no FP8 kernel takes are refused naming the product") {
  const Tensor<f8e4m3> a = cast<f8e4m3>(ones<float>({16, 16})).to(gpu), b = a;
  const Tensor<float> scale = ones<float>({1}).to(gpu);
  Tensor<bf16> c(Shape{16, 16}, gpu);
  cuda::GemmFp8 fp8{.a_scale_inv = scale.data(), .b_scale_inv = scale.data()};
  cuda::GemmArgs args{.dtype = DType::bf16,
                      .M = 16,
                      .N = 16,
                      .K = 16,
                      .a = {a.data(), 16, 0, false},
                      .b = {b.data(), 16, 0, false},
                      .c = {c.data(), 16, 0},
                      .fp8 = &fp8};
  CHECK_THROWS_WITH_AS(cuda::gemm(args, 0), doctest::Contains("FP8 kernels read both operands along K"), Error);
  args.b.transpose = true;
  fp8.a = fp8.b = DType::f8e5m2;
  CHECK_THROWS_WITH_AS(cuda::gemm(args, 0), doctest::Contains("not both f8e5m2"), Error);
  fp8.a = DType::f8e4m3;
  fp8.b_scale_inv = nullptr;
  CHECK_THROWS_WITH_AS(cuda::gemm(args, 0), doctest::Contains("need their scale_inv pointers"), Error);
  const Tensor<float> two_scales = ones<float>({2}).to(gpu);
  fp8.b_scale_inv = two_scales.data() + 1;
  CHECK_THROWS_WITH_AS(cuda::gemm(args, 0), doctest::Contains("scale_inv pointers must be 16-byte aligned"), Error);
  fp8.b_scale_inv = scale.data();
  args.dtype = DType::f8e4m3;
  CHECK_THROWS_WITH_AS(cuda::gemm(args, 0), doctest::Contains("is not a float dtype for a GEMM's output"), Error);
  args.dtype = DType::f32;
  Tensor<float> c_f32(Shape{16, 16}, gpu);
  const Tensor<float> bias = ones<float>({16}).to(gpu);
  args.c.data = c_f32.data();
  args.bias = bias.data();
  CHECK_THROWS_WITH_AS(cuda::gemm(args, 0), doctest::Contains("adds a bias only to a bf16 or f16 output"), Error);
  args.bias = nullptr;
  CHECK_NOTHROW(cuda::gemm(args, 0));
  // codes as C only after the GELU epilogue, and the epilogue on an fp8 product only into codes
  Tensor<f8e4m3> codes(Shape{16, 16}, gpu);
  Tensor<bf16> z(Shape{16, 16}, gpu);
  const Tensor<bf16> bias_bf16 = ones<bf16>({16}).to(gpu);
  fp8.c_codes = DType::f8e4m3;
  fp8.c_scale = scale.data();
  args.dtype = DType::bf16;
  args.c.data = codes.data();
  args.bias = bias_bf16.data();
  CHECK_THROWS_WITH_AS(cuda::gemm(args, 0), doctest::Contains("fp8 codes as C need the GELU epilogue"), Error);
  args.gelu_input = z.data();
  CHECK_NOTHROW(cuda::gemm(args, 0));
  fp8.c_codes.reset();
  args.c.data = c.data();
  CHECK_THROWS_WITH_AS(cuda::gemm(args, 0), doctest::Contains("(or codes after GELU)"), Error);
}

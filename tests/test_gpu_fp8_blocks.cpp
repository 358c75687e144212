// Block scaling on the GPU (ops/fp8/recipe.hpp's BlockScaling). Quantization (cuda/fp8_block_quantize.hpp): in 1×128
// tiles (the codes, and their transpose in 128×1 tiles of x) and in 128×128 blocks, from f32, bf16 and f16 of odd
// sizes, every code times its tile's scale bitwise the CPU's block_quantized, the scales laid out as cuBLASLt reads
// them (padding included), a tile holding a NaN or an infinity read as NaN, codes padded past x without a padded copy
// of x bitwise those of the copy. Products through cuBLASLt's block-scaled modes (cuda::gemm with Fp8Scaling) against
// the product of the same dequantized values in double, with the tolerances of tests/fp8_sums.hpp; the combinations no
// kernel takes refused by name.
#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>

#include "fp8_sums.hpp"
#include "gpu_reference.hpp"
#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/cuda/fp8_block_quantize.hpp"
#include "tapegrad/ops/fp8/detail/quantize.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::gpu;
using cuda::Fp8Scaling;

namespace {

const Device host = Device::cpu();

std::uint32_t bits(float v) { return std::bit_cast<std::uint32_t>(v); }

// x [rows, cols] quantized on the GPU in both layouts (the codes' rows padded to 4, the transpose's to 16, as
// layernorm_mlp pads them), back on the host.
struct Quantized {
  std::int64_t rows = 0, cols = 0, code_rows = 0, ld = 0;
  Fp8Scaling scaling = Fp8Scaling::tiles_1x128;
  Tensor<f8e4m3> codes, transposed;
  Tensor<float> scales, transposed_scales;
  // On the GPU, for products.
  Tensor<f8e4m3> codes_gpu, transposed_gpu;
  Tensor<float> scales_gpu, transposed_scales_gpu;

  // The scale of codes element (o, k) of the layout stored [outer, K] with these scales.
  static float scale_at(const Tensor<float>& scales, Fp8Scaling scaling, std::int64_t outer, std::int64_t K,
                        std::int64_t o, std::int64_t k) {
    const cuda::Fp8ScaleShape shape = cuda::fp8_scale_shape(scaling, outer, K);
    return scaling == Fp8Scaling::tiles_1x128 ? scales.flat(k / 128 * shape.ld + o)
                                              : scales.flat(o / 128 * shape.ld + k / 128);
  }
  // Element (r, c) of x as the codes read it, and as the transpose reads it.
  float value(std::int64_t r, std::int64_t c) const {
    return convert<float>(codes.flat(r * cols + c)) * scale_at(scales, scaling, code_rows, cols, r, c);
  }
  float transposed_value(std::int64_t r, std::int64_t c) const {
    return convert<float>(transposed.flat(c * ld + r)) * scale_at(transposed_scales, scaling, cols, ld, c, r);
  }
};

// x quantized as the top left corner of codes of `padded` rows and columns where given (zero codes elsewhere).
template <class T> Quantized quantize(const Tensor<T>& x, Fp8Scaling scaling, const Shape& padded = {}) {
  const std::int64_t rows = padded.rank() ? padded[0] : x.shape()[0], cols = padded.rank() ? padded[1] : x.shape()[1];
  const std::int64_t ld = (rows + 15) / 16 * 16;
  const Tensor<T> x_gpu = x.to(gpu);
  Quantized q;
  q.rows = rows;
  q.cols = cols;
  q.code_rows = (rows + 3) / 4 * 4;
  q.ld = ld;
  q.scaling = scaling;
  q.codes_gpu = Tensor<f8e4m3>(Shape{q.code_rows, cols}, gpu);
  q.transposed_gpu = Tensor<f8e4m3>(Shape{cols, ld}, gpu);
  q.scales_gpu = Tensor<float>(Shape{cuda::fp8_scale_shape(scaling, q.code_rows, cols).count()}, gpu);
  q.transposed_scales_gpu = Tensor<float>(Shape{cuda::fp8_scale_shape(scaling, cols, ld).count()}, gpu);
  cuda::fp8_block_quantize({.dtype = dtype_v<T>,
                            .x = x_gpu.data(),
                            .rows = x.shape()[0],
                            .cols = x.shape()[1],
                            .scaling = scaling,
                            .codes = q.codes_gpu.data(),
                            .codes_rows = q.code_rows,
                            .codes_cols = cols,
                            .scales = q.scales_gpu.data(),
                            .transposed = q.transposed_gpu.data(),
                            .transposed_ld = ld,
                            .transposed_scales = q.transposed_scales_gpu.data()},
                           0);
  q.codes = q.codes_gpu.to(host);
  q.transposed = q.transposed_gpu.to(host);
  q.scales = q.scales_gpu.to(host);
  q.transposed_scales = q.transposed_scales_gpu.to(host);
  return q;
}

// Every value of both layouts against the CPU's block_quantized (1×128 tiles for the codes, 128×1 for the
// transpose; 128×128 blocks for both), the padding rows of both zero codes, the scales' padding ones.
template <class T> void check_quantization(const Tensor<T>& x, Fp8Scaling scaling) {
  INFO(dtype_name(dtype_v<T>), ", shape ", x.shape(), (scaling == Fp8Scaling::tiles_1x128 ? ", tiles" : ", blocks"));
  const Quantized q = quantize(x, scaling);
  const bool tiles = scaling == Fp8Scaling::tiles_1x128;
  const Tensor<float> along_columns = detail::block_quantized<float>(x, q.rows, q.cols, tiles ? 1 : 128, 128);
  const Tensor<float> along_rows = detail::block_quantized<float>(x, q.rows, q.cols, 128, tiles ? 1 : 128);
  std::int64_t bad = 0, bad_transposed = 0, bad_padding = 0;
  for (std::int64_t r = 0; r < q.rows; ++r) {
    for (std::int64_t c = 0; c < q.cols; ++c) {
      bad += bits(q.value(r, c)) != bits(along_columns.flat(r * q.cols + c));
      bad_transposed += bits(q.transposed_value(r, c)) != bits(along_rows.flat(r * q.cols + c));
    }
  }
  for (std::int64_t c = 0; c < q.cols; ++c) {
    for (std::int64_t r = q.rows; r < q.ld; ++r) bad_padding += q.transposed.flat(c * q.ld + r).bits != 0;
    for (std::int64_t r = q.rows; r < q.code_rows; ++r) bad_padding += q.codes.flat(r * q.cols + c).bits != 0;
  }
  CHECK(bad == 0);
  CHECK(bad_transposed == 0);
  CHECK(bad_padding == 0);
  // The scales' rows are padded to a multiple of 4: ones there (a tile of zeros has scale 1).
  const auto check_padding = [&](const Tensor<float>& scales, std::int64_t outer, std::int64_t K) {
    const cuda::Fp8ScaleShape shape = cuda::fp8_scale_shape(scaling, outer, K);
    const std::int64_t used = tiles ? outer : (K + 127) / 128;
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < shape.rows; ++i) {
      for (std::int64_t j = used; j < shape.ld; ++j) wrong += scales.flat(i * shape.ld + j) != 1.0f;
    }
    CHECK(wrong == 0);
  };
  check_padding(q.scales, q.code_rows, q.cols);
  check_padding(q.transposed_scales, q.cols, q.ld);
}

// C [M, N] = A [M, K] · Bᵀ (B stored [N, K]) + beta · C in bf16 from block-quantized operands, against the double
// sum of the dequantized values (tests/fp8_sums.hpp).
void check_product(std::int64_t M, std::int64_t N, std::int64_t K, Fp8Scaling a_scaling, Fp8Scaling b_scaling,
                   bool accumulate, std::uint64_t seed) {
  CAPTURE(M);
  CAPTURE(N);
  CAPTURE(K);
  CAPTURE(static_cast<int>(a_scaling));
  CAPTURE(static_cast<int>(b_scaling));
  CAPTURE(accumulate);
  // Rows of very different magnitudes, so that every tile has a scale of its own.
  Tensor<float> a = randn<float>({M, K}, seed, 0.0, 1.0), b = randn<float>({N, K}, seed + 1, 0.0, 1.0);
  for (std::int64_t i = 0; i < a.numel(); ++i) a.flat(i) *= std::exp2(static_cast<float>(i / K % 7 - 3));
  for (std::int64_t i = 0; i < b.numel(); ++i) b.flat(i) *= std::exp2(static_cast<float>(i % 5 - 2));
  const Quantized qa = quantize(a, a_scaling), qb = quantize(b, b_scaling);
  const Tensor<bf16> c0 = randn<bf16>({M, N}, seed + 2);
  Tensor<bf16> c_gpu = c0.to(gpu);
  const cuda::GemmFp8 fp8{.a_scale_inv = qa.scales_gpu.data(),
                          .b_scale_inv = qb.scales_gpu.data(),
                          .a_scaling = a_scaling,
                          .b_scaling = b_scaling};
  try {
    cuda::gemm({.dtype = DType::bf16,
                .M = M,
                .N = N,
                .K = K,
                .a = {qa.codes_gpu.data(), K, 0, false},
                .b = {qb.codes_gpu.data(), K, 0, true},
                .c = {c_gpu.data(), N, 0},
                .beta = accumulate ? 1.0 : 0.0,
                .fp8 = &fp8},
               0);
  } catch (const Error& e) {
    FAIL_CHECK(std::string(e.what()));
    return;
  }
  test::check_fp8_sums(
      c_gpu.to(host), M, N, K, [&](std::int64_t i, std::int64_t k) { return double{qa.value(i, k)}; },
      [&](std::int64_t j, std::int64_t k) { return double{qb.value(j, k)}; },
      [&](std::int64_t i, std::int64_t j) { return accumulate ? convert<double>(c0.flat(i * N + j)) : 0.0; }, false);
}

}  // namespace

TEST_CASE("block scaling's quantization on the GPU gives the CPU's tiles, with the scales cuBLASLt reads") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  // One element, tiles cut short in rows and columns, several tiles each way, runs of 8 and single elements.
  for (const Shape& shape :
       {Shape{1, 1}, Shape{37, 70}, Shape{300, 260}, Shape{129, 385}, Shape{200, 8}, Shape{3, 129}}) {
    Tensor<float> x = randn<float>(shape, seed, 0.0, 2.0);
    // Magnitudes that change along both axes: every 1×128 tile and 128×1 tile has its own scale.
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      x.flat(i) *= std::exp2(static_cast<float>(i / shape[1] % 9 + i % shape[1] % 11 - 12));
    }
    x.flat(0) = 0.0f;
    for (Fp8Scaling scaling : {Fp8Scaling::tiles_1x128, Fp8Scaling::blocks_128x128}) {
      check_quantization(x, scaling);
      check_quantization(cast<bf16>(x), scaling);
      check_quantization(cast<f16>(x), scaling);
    }
  }
  // A tile of zeros has scale 1; one holding a NaN or an infinity is read as NaN, the others as usual.
  Tensor<float> x = randn<float>({130, 200}, seed);
  for (std::int64_t c = 0; c < 128; ++c) x.flat(c) = 0.0f;
  x.flat(200 + 5) = NAN;
  x.flat(2 * 200 + 150) = INFINITY;
  const Quantized q = quantize(x, Fp8Scaling::tiles_1x128);
  CHECK(q.value(0, 3) == 0.0f);
  CHECK(q.scales.flat(0) == 1.0f);
  CHECK(std::isnan(q.value(1, 100)));
  CHECK(std::isnan(q.value(2, 190)));
  CHECK(!std::isnan(q.value(2, 100)));
  CHECK(std::isnan(q.transposed_value(100, 5)));  // the 128×1 tiles of columns 5 and 150
  CHECK(std::isnan(q.transposed_value(0, 150)));
  CHECK(!std::isnan(q.transposed_value(129, 5)));
  // Into padded codes without a padded copy of x: the codes, transposes and scales of x padded with zeros.
  const Tensor<float> corner = randn<float>({100, 200}, seed + 3);
  Tensor<float> zero_padded = zeros<float>({128, 256});
  for (std::int64_t r = 0; r < 100; ++r) {
    for (std::int64_t c = 0; c < 200; ++c) zero_padded.flat(r * 256 + c) = corner.flat(r * 200 + c);
  }
  for (Fp8Scaling scaling : {Fp8Scaling::tiles_1x128, Fp8Scaling::blocks_128x128}) {
    const Quantized direct = quantize(cast<bf16>(corner), scaling, {128, 256});
    const Quantized copied = quantize(cast<bf16>(zero_padded), scaling);
    CHECK(test::bitwise_equal(direct.codes, copied.codes));
    CHECK(test::bitwise_equal(direct.transposed, copied.transposed));
    CHECK(test::bitwise_equal(direct.scales, copied.scales));
    CHECK(test::bitwise_equal(direct.transposed_scales, copied.transposed_scales));
  }
  const Quantized blocks = quantize(x, Fp8Scaling::blocks_128x128);
  CHECK(std::isnan(blocks.value(127, 127)));
  CHECK(std::isnan(blocks.transposed_value(0, 199)));
  CHECK(!std::isnan(blocks.value(129, 0)));
  CHECK_THROWS_WITH_AS(cuda::fp8_block_quantize({.dtype = DType::f64, .x = x.data(), .rows = 8, .cols = 8}, 0),
                       doctest::Contains("fp8_block_quantize: quantizes f32, bf16 or f16, not f64"), Error);
  CHECK_THROWS_WITH_AS(
      cuda::fp8_block_quantize({.x = x.data(), .rows = 8, .cols = 8, .scaling = Fp8Scaling::tensor}, 0),
      doctest::Contains("quantizes in 1x128 tiles or 128x128 blocks"), Error);
}

TEST_CASE("block-scaled fp8 products through cuBLASLt are the products of the dequantized operands") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  // An activation times a weight (forward and dgrad), two activations (wgrad), a weight times an activation; one
  // tile and several along K; rows a multiple of 4 (what 1×128 tiles take) but of no tile.
  for (const auto [M, N, K] : {std::array<std::int64_t, 3>{128, 128, 128}, {200, 144, 512}, {36, 16, 128},
                               {64, 48, 384}, {256, 384, 1024}, {20, 136, 256}}) {
    for (const auto [a, b] : {std::array{Fp8Scaling::tiles_1x128, Fp8Scaling::blocks_128x128},
                              {Fp8Scaling::tiles_1x128, Fp8Scaling::tiles_1x128},
                              {Fp8Scaling::blocks_128x128, Fp8Scaling::tiles_1x128}}) {
      check_product(M, N, K, a, b, false, seed);
    }
    check_product(M, N, K, Fp8Scaling::tiles_1x128, Fp8Scaling::blocks_128x128, true, seed);
  }
}

TEST_CASE("block-scaled fp8 products that no kernel takes are refused naming the product") {
  const Tensor<f8e4m3> a = cast<f8e4m3>(ones<float>({128, 128})).to(gpu);
  const Tensor<float> scales = ones<float>({128}).to(gpu), bias = ones<float>({128}).to(gpu);
  Tensor<bf16> c(Shape{128, 128}, gpu);
  cuda::GemmFp8 fp8{.a_scale_inv = scales.data(),
                    .b_scale_inv = scales.data(),
                    .a_scaling = Fp8Scaling::blocks_128x128,
                    .b_scaling = Fp8Scaling::blocks_128x128};
  cuda::GemmArgs args{.dtype = DType::bf16,
                      .M = 128,
                      .N = 128,
                      .K = 128,
                      .a = {a.data(), 128, 0, false},
                      .b = {a.data(), 128, 0, true},
                      .c = {c.data(), 128, 0},
                      .fp8 = &fp8};
  CHECK_THROWS_WITH_AS(cuda::gemm(args, 0), doctest::Contains("at most one operand in 128x128 blocks"), Error);
  fp8.a_scaling = Fp8Scaling::tiles_1x128;
  fp8.fast_accumulation = true;
  CHECK_THROWS_WITH_AS(cuda::gemm(args, 0), doctest::Contains("take neither fast accumulation nor a bias"), Error);
  fp8.fast_accumulation = false;
  args.bias = bias.data();
  CHECK_THROWS_WITH_AS(cuda::gemm(args, 0), doctest::Contains("e4m3 (1x128 tiles) × f8e4m3 (128x128 blocks)"),
                       Error);
  args.bias = nullptr;
  args.M = 126;
  CHECK_THROWS_WITH_AS(cuda::gemm(args, 0), doctest::Contains("needs its rows (M for A, N for B) a multiple of 4"),
                       Error);
  args.M = 128;
  args.K = 64;
  CHECK_THROWS_WITH_AS(cuda::gemm(args, 0), doctest::Contains("need K a multiple of 128"), Error);
  args.K = 128;
  CHECK_NOTHROW(cuda::gemm(args, 0));
}

// matmul on the GPU (cuBLASLt) against the CPU in double: values and gradients over the four dtypes and matmul's
// shape rules (odd sizes, vectors, batches, broadcast batches, empty sizes), the TF32 switch, the GEMM entry
// point's own options (transposes, leading dimensions, batch strides, alpha and beta, the bias epilogue), bitwise
// run-to-run determinism, and errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/cuda/detail/activation_math.hpp"
#include "tapegrad/tensor/gpu/device.hpp"
#include "gpu_reference.hpp"
#include "tapegrad/ops/detail/gemm.hpp"

using namespace tapegrad;
using test::check_against_cpu;
using test::check_close;
using test::GpuInput;
using test::gpu;
using test::Tolerance;

namespace {

const Device host = Device::cpu();

// Tolerances for sums of up to `length` products of randn values, whose typical size is √length. rtol covers the
// GPU's one rounding to T, atol (scaled by √length) the accumulation error and the rounding of results that nearly
// cancel.
template <class T> Tolerance tolerance(std::int64_t length) {
  const double scale = std::sqrt(static_cast<double>(std::max<std::int64_t>(length, 1)));
  if constexpr (std::is_same_v<T, double>) {
    return {1e-12, 1e-12 * scale};  // double on both sides: only the order of summation differs
  } else if constexpr (std::is_same_v<T, float>) {
    // Exact FP32 accumulates along K with one rounding per term: errors near 3e-8 · length (1e-4 at length 4096),
    // ten times below this. TF32's rounding of the inputs (~5e-4 · √length) is far above it.
    return {2e-5, 2e-5 * scale};
  } else if constexpr (std::is_same_v<T, bf16>) {
    // One rounding to bf16 (2^-8 relative), in f32 accumulation; a gradient summed over the products that share
    // an operand rounds each product first: √products roundings of up to 2^-8 of a term each,
    // hence 4 · 2^-8 · √length.
    return {0x1p-7, 0x1p-6 * scale};
  } else {
    return {0x1p-10, 0x1p-9 * scale};  // f16: as bf16, with 2^-11 per rounding
  }
}

// TF32 keeps 10 mantissa bits of each f32 input: each product is off by up to ~2^-10 of itself, in random
// directions over `length` terms (~5e-4 · √length), plus FP32 accumulation.
Tolerance tf32_tolerance(std::int64_t length) {
  const double scale = std::sqrt(static_cast<double>(length));
  return {1e-2, 1e-2 * scale};
}

Shape batch_of(const Shape& s) {
  const auto dims = s.dims();
  return s.rank() > 2 ? Shape(dims.first(dims.size() - 2)) : Shape{};
}

// The longest sum among the product and its two gradients: K, or N (M) times the number of products, which is how
// many terms dA (dB) adds up where a matrix is shared by every product.
std::int64_t longest_sum(const Shape& a, const Shape& b) {
  const std::int64_t K = a.dim(-1), M = a.rank() >= 2 ? a.dim(-2) : 1, N = b.rank() >= 2 ? b.dim(-1) : 1;
  const std::int64_t products = broadcast_shapes(batch_of(a), batch_of(b), "test").numel();
  return std::max({K, products * M, products * N});
}

const auto matmul_inputs = [](const auto& v) { return matmul(v[0], v[1]); };

struct MatmulCase {
  Shape a, b;
};

template <class T> test::Run<T> check_matmul(const MatmulCase& c, std::uint64_t seed) {
  CAPTURE(c.a);
  CAPTURE(c.b);
  return check_against_cpu<T>("matmul", matmul_inputs, {GpuInput(c.a), GpuInput(c.b)},
                              tolerance<T>(longest_sum(c.a, c.b)), seed);
}

bool all_zero(const Tensor<double>& t) {
  return std::all_of(t.span().begin(), t.span().end(), [](double v) { return v == 0.0; });
}

// Sets one of cuda::gemm's process-wide switches for a scope.
template <bool (*Get)(), void (*Set)(bool)> class GemmSwitch {
 public:
  explicit GemmSwitch(bool on) : previous_(Get()) { Set(on); }
  ~GemmSwitch() { Set(previous_); }
  GemmSwitch(const GemmSwitch&) = delete;
  GemmSwitch& operator=(const GemmSwitch&) = delete;

 private:
  bool previous_;
};
using Tf32Switch = GemmSwitch<cuda::allow_tf32, cuda::set_allow_tf32>;
using AutotuneSwitch = GemmSwitch<cuda::gemm_autotune, cuda::set_gemm_autotune>;

}  // namespace

TEST_CASE_TEMPLATE("matmul on the GPU matches the CPU for square and odd sizes", T, TAPEGRAD_GPU_DTYPES) {
  const MatmulCase cases[] = {
      // square
      {{1, 1}, {1, 1}}, {{7, 7}, {7, 7}}, {{33, 33}, {33, 33}}, {{129, 129}, {129, 129}}, {{1000, 1000}, {1000, 1000}},
      // odd and unequal
      {{7, 33}, {33, 129}}, {{129, 1000}, {1000, 33}}, {{1000, 7}, {7, 1}}, {{1, 1000}, {1000, 7}},
  };
  std::uint64_t seed = 10;
  for (const MatmulCase& c : cases) check_matmul<T>(c, seed += 10);
}

TEST_CASE_TEMPLATE("matmul on the GPU takes vectors in either position, dropping their axis", T, TAPEGRAD_GPU_DTYPES) {
  const MatmulCase cases[] = {
      {{33}, {33, 7}}, {{7, 33}, {33}}, {{129}, {129}}, {{1}, {1}}, {{4, 7, 33}, {33}}, {{33}, {4, 33, 7}},
  };
  std::uint64_t seed = 200;
  for (const MatmulCase& c : cases) check_matmul<T>(c, seed += 10);
}

TEST_CASE_TEMPLATE("matmul on the GPU multiplies stacks, sharing a single matrix on either side",
                   T, TAPEGRAD_GPU_DTYPES) {
  const MatmulCase cases[] = {
      {{5, 7, 33}, {5, 33, 129}},      // one product per stacked pair
      {{5, 7, 33}, {33, 129}},         // x · W: one tall GEMM forward and for dA, one GEMM over all rows for dB
      {{2, 3, 7, 33}, {33, 9}},        // the same over two batch axes
      {{7, 33}, {5, 33, 129}},         // a shared left matrix: batch stride 0, its gradient summed over the products
      {{1, 1, 7, 33}, {2, 3, 33, 9}},  // ... with unit batch axes of its own
  };
  std::uint64_t seed = 300;
  for (const MatmulCase& c : cases) check_matmul<T>(c, seed += 10);
}

TEST_CASE_TEMPLATE("matmul on the GPU broadcasts batch axes both ways and along some axes only",
                   T, TAPEGRAD_GPU_DTYPES) {
  // Each operand broadcast along an axis the other has: both expanded, both gradients summed back (sum_to).
  const MatmulCase cases[] = {
      {{2, 1, 7, 33}, {3, 33, 9}},
      {{4, 1, 7, 5}, {1, 3, 5, 6}},
      {{2, 3, 7, 5}, {3, 5, 4}},  // the right stack repeated along the first axis
      {{3, 7, 5}, {2, 1, 5, 4}},
  };
  std::uint64_t seed = 400;
  for (const MatmulCase& c : cases) check_matmul<T>(c, seed += 10);
}

TEST_CASE_TEMPLATE("matmul on the GPU over K = 0 gives zeros, and empty M, N or batches give empty results",
                   T, TAPEGRAD_GPU_DTYPES) {
  for (const MatmulCase& c : {MatmulCase{{7, 0}, {0, 9}}, MatmulCase{{3, 7, 0}, {0, 9}}, MatmulCase{{0}, {0}}}) {
    const test::Run<T> got = check_matmul<T>(c, 500);
    CHECK(got.y.numel() > 0);
    CHECK(all_zero(got.y));
  }
  // The gradients here are sums over nothing, hence zeros, which check_matmul compares with the CPU's.
  const MatmulCase empty[] = {
      {{0, 33}, {33, 7}},     // M = 0: dB is zeros
      {{7, 33}, {33, 0}},     // N = 0: dA is zeros
      {{0, 7, 33}, {33, 9}},  // no products: dB, summed over all of them, is zeros
      {{7, 33}, {0, 33, 9}},  // ... and dA
  };
  std::uint64_t seed = 510;
  for (const MatmulCase& c : empty) {
    const test::Run<T> got = check_matmul<T>(c, seed += 10);
    CHECK(got.y.numel() == 0);
  }
}

TEST_CASE_TEMPLATE("matmul with a bias on the GPU matches the CPU: one tall product, stacks, and a shared stack",
                   T, TAPEGRAD_GPU_DTYPES) {
  const MatmulCase cases[] = {{{7, 33}, {33, 129}}, {{4, 33, 40}, {40, 24}}, {{3, 5, 33}, {3, 33, 7}}, {{33}, {33, 9}}};
  std::uint64_t seed = 600;
  for (const MatmulCase& c : cases) {
    CAPTURE(c.a);
    CAPTURE(c.b);
    // (the bias adds one term to each output's sum: the dB and dbias sums are at most longest_sum long)
    check_against_cpu<T>("matmul", [](const auto& v) { return matmul(v[0], v[1], v[2]); },
                         {GpuInput(c.a), GpuInput(c.b), GpuInput(Shape{c.b.dim(-1)})},
                         tolerance<T>(longest_sum(c.a, c.b) + 1), seed += 10);
  }
}

TEST_CASE_TEMPLATE("matmul of GPU inputs leaves its result and gradients on the GPU", T, TAPEGRAD_GPU_DTYPES) {
  const Var<T> a = param(randn<T>({2, 7, 33}, 1).to(gpu)), b = param(randn<T>({33, 5}, 2).to(gpu));
  const Var<T> y = matmul(a, b);
  CHECK(y.value().device() == gpu);
  backward(y, randn<T>(y.shape(), 3).to(gpu));
  CHECK(a.grad().device() == gpu);
  CHECK(b.grad().device() == gpu);
}

TEST_CASE("f32 matmul on the GPU is exact FP32 unless TF32 is allowed") {
  constexpr std::int64_t K = 4096;
  const Tensor<float> a = randn<float>({64, K}, 5), b = randn<float>({K, 96}, 6);
  const Tensor<double> want = matmul(constant(cast<double>(a)), constant(cast<double>(b))).value();
  const auto on_gpu = [&] { return matmul(constant(a.to(gpu)), constant(b.to(gpu))).value().to(host); };
  CHECK_FALSE(cuda::allow_tf32());
  check_close(on_gpu(), want, tolerance<float>(K));

  const Tf32Switch allowed(true);
  CHECK(cuda::allow_tf32());
  const Tensor<float> fast = on_gpu();
  check_close(fast, want, tf32_tolerance(K));
  // The switch takes effect: TF32's rounding of the inputs is far outside the FP32 tolerance.
  CHECK(test::worst_element(fast, want, tolerance<float>(K)).ratio > 1.0);
  check_against_cpu<float>("matmul with TF32", matmul_inputs, {GpuInput({64, K}), GpuInput({K, 96})},
                           tf32_tolerance(K), 7);
}

namespace {

// One call of the GEMM entry point: sizes, stored transposed or not, padding of every leading dimension, operands
// shared by the whole batch (stride 0), scalars and a bias.
struct GemmCase {
  std::int64_t M, N, K, batch;
  bool trans_a = false, trans_b = false;
  std::int64_t pad = 0;
  bool shared_a = false, shared_b = false;
  double alpha = 1.0, beta = 0.0;
  bool bias = false;
  bool gelu = false;   // the GELU epilogue (needs the bias, batch 1, no padding here)
  bool dgelu = false;  // the GELU-derivative epilogue (no bias, beta 0, batch 1, no padding here)
  bool bias_gradient = false;  // with dgelu: C's column sums
};

// C = the product (want, in double) times GELU'(gelu_input), and, if asked, its column sums (C's M rows of errors
// within the product's tolerance, added: M times K terms).
template <class O>
void check_gelu_derivative(const GemmCase& e, const Tensor<O>& c_gpu, const Tensor<O>& bias_gradient_gpu,
                           const Tensor<O>& gelu_input, Tensor<double> want) {
  Tensor<double> sums = zeros<double>({e.N});
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    double grad = 0;
    activation::gelu_tanh(static_cast<double>(gelu_input.flat(i)), &grad);
    want.flat(i) *= grad;
    sums.flat(i % e.N) += want.flat(i);
  }
  // In f32, cuBLASLt's own evaluation of GELU' (an approximate tanh) adds errors of ~1e-4 × the product, above the
  // product's rounding (measured on the H200: 1.06 × the plain product's tolerance at K = 96).
  const double epilogue_error = std::is_same_v<O, float> ? 5.0 : 1.0;
  Tolerance tol = tolerance<O>(e.K), sums_tol = tolerance<O>(e.K * e.M);
  tol.atol *= epilogue_error;
  sums_tol.atol *= epilogue_error;
  check_close(c_gpu.to(host), want, tol);
  if (e.bias_gradient) check_close(bias_gradient_gpu.to(host), sums, sums_tol);
}

// Runs the case through cuda::gemm on A and B in T, with C and the bias in O (T, or its compute type for a wide
// output), and through the CPU gemm in double on the same values (C's padding included, which neither may touch),
// and compares all of C. O's tolerance: a wide output is the f32 accumulation of exact products, rounded once.
template <class T, class O = T> void check_gemm(const GemmCase& e, std::uint64_t seed) {
  CAPTURE(e.M);
  CAPTURE(e.N);
  CAPTURE(e.K);
  CAPTURE(e.batch);
  CAPTURE(e.trans_a);
  CAPTURE(e.trans_b);
  CAPTURE(e.shared_a);
  CAPTURE(e.shared_b);
  CAPTURE(e.bias);
  CAPTURE(e.gelu);
  CAPTURE(e.dgelu);
  const std::int64_t a_rows = e.trans_a ? e.K : e.M, a_cols = e.trans_a ? e.M : e.K;
  const std::int64_t b_rows = e.trans_b ? e.N : e.K, b_cols = e.trans_b ? e.K : e.N;
  const std::int64_t lda = a_cols + e.pad, ldb = b_cols + e.pad, ldc = e.N + e.pad;
  const std::int64_t stride_a = e.shared_a ? 0 : a_rows * lda, stride_b = e.shared_b ? 0 : b_rows * ldb,
                     stride_c = e.M * ldc;
  const Tensor<T> a = randn<T>({(e.shared_a ? 1 : e.batch) * a_rows * lda}, seed);
  const Tensor<T> b = randn<T>({(e.shared_b ? 1 : e.batch) * b_rows * ldb}, seed + 1);
  const Tensor<O> c = randn<O>({e.batch * stride_c}, seed + 2);
  const Tensor<O> bias = randn<O>({e.N}, seed + 3);

  const Tensor<T> a_gpu = a.to(gpu), b_gpu = b.to(gpu);
  const Tensor<O> bias_gpu = bias.to(gpu);
  Tensor<O> c_gpu = c.to(gpu);
  Tensor<O> sum_gpu(Shape{e.gelu ? e.batch * stride_c : 0}, gpu);
  const Tensor<O> gelu_input = randn<O>({e.dgelu ? stride_c : 0}, seed + 4);  // GELU's input, for its derivative
  const Tensor<O> gelu_input_gpu = gelu_input.to(gpu);
  Tensor<O> bias_gradient_gpu(Shape{e.bias_gradient ? e.N : 0}, gpu);
  cuda::gemm({.dtype = dtype_v<T>,
              .M = e.M,
              .N = e.N,
              .K = e.K,
              .batch = e.batch,
              .a = {a_gpu.data(), lda, stride_a, e.trans_a},
              .b = {b_gpu.data(), ldb, stride_b, e.trans_b},
              .c = {c_gpu.data(), ldc, stride_c},
              .alpha = e.alpha,
              .beta = e.beta,
              .bias = e.bias ? bias_gpu.data() : nullptr,
              .gelu_input = e.gelu ? sum_gpu.data() : nullptr,
              .dgelu_input = e.dgelu ? gelu_input_gpu.data() : nullptr,
              .bias_gradient = e.bias_gradient ? bias_gradient_gpu.data() : nullptr,
              .wide_output = !std::is_same_v<O, T>},
             0);

  const Tensor<double> a_d = cast<double>(a), b_d = cast<double>(b), bias_d = cast<double>(bias);
  Tensor<double> want = cast<double>(c);
  for (std::int64_t i = 0; i < e.batch; ++i) {
    double* c_i = want.data() + i * stride_c;
    gemm<double>(e.trans_a ? Transpose::yes : Transpose::no, e.trans_b ? Transpose::yes : Transpose::no, e.M, e.N,
                 e.K, e.alpha, a_d.data() + i * stride_a, lda, b_d.data() + i * stride_b, ldb, e.beta, c_i, ldc);
    for (std::int64_t r = 0; e.bias && r < e.M; ++r) {
      for (std::int64_t j = 0; j < e.N; ++j) c_i[r * ldc + j] += bias_d.flat(j);
    }
  }
  if (e.dgelu) return check_gelu_derivative(e, c_gpu, bias_gradient_gpu, gelu_input, std::move(want));
  if (!e.gelu) return check_close(c_gpu.to(host), want, tolerance<O>(e.K));
  // The sum (rounded to O) where asked, and C its tanh-GELU (|GELU'| < 1.13: the sum's tolerance holds).
  check_close(sum_gpu.to(host), want, tolerance<O>(e.K));
  for (double& v : want.span()) v = activation::gelu_tanh(v, static_cast<double*>(nullptr));
  check_close(c_gpu.to(host), want, tolerance<O>(e.K));
}

}  // namespace

TEST_CASE_TEMPLATE("cuda::gemm computes alpha·op(A)·op(B) + beta·C for every transpose, padding and batch stride",
                   T, TAPEGRAD_GPU_DTYPES) {
  std::uint64_t seed = 600;
  for (const bool trans_a : {false, true}) {
    for (const bool trans_b : {false, true}) {
      check_gemm<T>({.M = 7, .N = 33, .K = 129, .batch = 1, .trans_a = trans_a, .trans_b = trans_b}, seed += 10);
      check_gemm<T>({.M = 33, .N = 7, .K = 65, .batch = 3, .trans_a = trans_a, .trans_b = trans_b, .pad = 3,
                     .alpha = 0.5, .beta = -1.5},
                    seed += 10);
    }
  }
  // A or B shared by the whole batch (batch stride 0).
  check_gemm<T>({.M = 9, .N = 17, .K = 33, .batch = 4, .shared_a = true}, seed += 10);
  check_gemm<T>({.M = 9, .N = 17, .K = 33, .batch = 4, .trans_b = true, .shared_b = true}, seed += 10);
  // Vector-like extremes.
  check_gemm<T>({.M = 1, .N = 1, .K = 1000, .batch = 2}, seed += 10);
  check_gemm<T>({.M = 1000, .N = 1, .K = 1, .batch = 1, .trans_a = true}, seed += 10);
}

TEST_CASE_TEMPLATE("cuda::gemm's bias epilogue adds the bias to every row of every product", T, TAPEGRAD_GPU_DTYPES) {
  std::uint64_t seed = 700;
  check_gemm<T>({.M = 7, .N = 33, .K = 129, .batch = 1, .bias = true}, seed += 10);
  check_gemm<T>({.M = 129, .N = 1000, .K = 33, .batch = 1, .trans_b = true, .bias = true}, seed += 10);
  check_gemm<T>({.M = 33, .N = 7, .K = 65, .batch = 3, .trans_a = true, .pad = 3, .shared_b = true, .alpha = 0.5,
                 .beta = 2.0, .bias = true},
                seed += 10);
  // K = 0: an empty product, so C = beta·C + bias (or just the bias), by tapegrad's own kernel.
  check_gemm<T>({.M = 7, .N = 33, .K = 0, .batch = 3, .pad = 2, .beta = 2.0, .bias = true}, seed += 10);
  check_gemm<T>({.M = 7, .N = 33, .K = 0, .batch = 1, .bias = true}, seed += 10);
  check_gemm<T>({.M = 7, .N = 33, .K = 0, .batch = 2, .pad = 1}, seed += 10);
}

TEST_CASE_TEMPLATE("cuda::gemm's GELU epilogue writes the sum and its tanh-GELU (bf16, f16, f32)", T,
                   TAPEGRAD_GPU_DTYPES) {
  std::uint64_t seed = 750;
  if constexpr (std::is_same_v<T, double>) {
    CHECK_THROWS_WITH_AS(check_gemm<T>({.M = 7, .N = 40, .K = 129, .batch = 1, .bias = true, .gelu = true}, seed),
                         doctest::Contains("gemm: the GELU epilogue needs a bias, one product, a bf16, f16 or f32"),
                         Error);
  } else {
    check_gemm<T>({.M = 7, .N = 40, .K = 129, .batch = 1, .bias = true, .gelu = true}, seed += 10);
    check_gemm<T>({.M = 257, .N = 1024, .K = 96, .batch = 1, .trans_b = true, .bias = true, .gelu = true}, seed += 10);
    check_gemm<T>({.M = 7, .N = 16, .K = 0, .batch = 1, .bias = true, .gelu = true}, seed += 10);  // own kernel
  }
}

TEST_CASE_TEMPLATE("cuda::gemm's GELU-derivative epilogue multiplies by GELU' of its input and sums the columns",
                   T, TAPEGRAD_GPU_DTYPES) {
  std::uint64_t seed = 770;
  if constexpr (std::is_same_v<T, double>) {
    CHECK_THROWS_WITH_AS(check_gemm<T>({.M = 7, .N = 40, .K = 129, .batch = 1, .dgelu = true}, seed),
                         doctest::Contains("gemm: the GELU-derivative epilogue needs no bias, beta 0"), Error);
  } else {
    check_gemm<T>({.M = 7, .N = 40, .K = 129, .batch = 1, .dgelu = true}, seed += 10);
    check_gemm<T>({.M = 257, .N = 1024, .K = 96, .batch = 1, .trans_b = true, .dgelu = true, .bias_gradient = true},
                  seed += 10);
    check_gemm<T>({.M = 64, .N = 48, .K = 0, .batch = 1, .dgelu = true, .bias_gradient = true}, seed += 10);
  }
}

TEST_CASE_TEMPLATE("cuda::gemm writes a wide output: the f32 accumulation of 16-bit inputs, rounded once",
                   T, TAPEGRAD_GPU_DTYPES) {
  using O = compute_t<T>;
  std::uint64_t seed = 800;
  check_gemm<T, O>({.M = 7, .N = 33, .K = 1000, .batch = 1, .trans_a = true}, seed += 10);
  check_gemm<T, O>({.M = 65, .N = 129, .K = 4096, .batch = 1, .trans_a = true}, seed += 10);
  check_gemm<T, O>({.M = 33, .N = 7, .K = 65, .batch = 3, .trans_b = true, .pad = 3, .beta = 1.0, .bias = true},
                   seed += 10);
  check_gemm<T, O>({.M = 7, .N = 33, .K = 0, .batch = 2, .beta = 2.0, .bias = true}, seed += 10);
}

TEST_CASE_TEMPLATE("cuda::gemm with autotuning computes the same products and leaves C alone while it times",
                   T, TAPEGRAD_GPU_DTYPES) {
  const AutotuneSwitch tuned(true);
  std::uint64_t seed = 900;
  // Shapes no other test uses: each is tuned here, beta != 0 shows that the timing runs do not write C.
  check_gemm<T>({.M = 37, .N = 41, .K = 257, .batch = 1, .beta = 1.0, .bias = true}, seed += 10);
  check_gemm<T>({.M = 43, .N = 11, .K = 129, .batch = 3, .trans_a = true, .pad = 2, .alpha = 2.0, .beta = -0.5},
                seed += 10);
  check_gemm<T, compute_t<T>>({.M = 96, .N = 160, .K = 2048, .batch = 1, .trans_a = true, .beta = 1.0}, seed += 10);
  // The kept algorithm gives the same bits on every later call.
  const Tensor<T> a = randn<T>({256, 512}, seed, 0, 1, gpu), b = randn<T>({512, 384}, seed + 1, 0, 1, gpu);
  const auto product = [&] { return matmul(constant(a), constant(b)).value().to(host); };
  const Tensor<T> first = product();
  for (int run = 0; run < 3; ++run) CHECK(test::bitwise_equal(product(), first));
}

TEST_CASE_TEMPLATE("matmul on the GPU gives bitwise the same values and gradients on every run",
                   T, TAPEGRAD_GPU_DTYPES) {
  // The folded GEMMs of x · W, a batched GEMM, a left operand shared by the batch (stride 0; a constant, so that
  // no sum over the batch is involved), and a long K that invites split-K algorithms.
  const std::vector<GpuInput> cases[] = {
      {GpuInput({4, 129, 1000}), GpuInput({1000, 33})},
      {GpuInput({5, 7, 33}), GpuInput({5, 33, 129})},
      {GpuInput({33}, GpuInput::normal, false), GpuInput({4, 33, 7})},
      {GpuInput({64, 8192}), GpuInput({8192, 64})},
  };
  for (const std::vector<GpuInput>& inputs : cases) {
    CAPTURE(inputs[0].shape);
    CAPTURE(inputs[1].shape);
    const std::vector<Tensor<T>> values{randn<T>(inputs[0].shape, 1), randn<T>(inputs[1].shape, 2)};
    const auto run = [&] { return test::run_op<T, T>(matmul_inputs, inputs, values, nullptr, gpu, 3); };
    const test::Run<T> first = run(), second = run();
    CHECK(test::bitwise_equal(first.y, second.y));
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      if (inputs[k].requires_grad) CHECK(test::bitwise_equal(first.grads[k], second.grads[k]));
    }
  }
}

TEST_CASE("matmul on the GPU rejects shapes that do not align, like the CPU") {
  const Var<float> a = constant(randn<float>({3, 4}, 1).to(gpu));
  CHECK_THROWS_WITH_AS(matmul(a, constant(randn<float>({5, 6}, 2).to(gpu))),
                       "matmul: shapes [3, 4] and [5, 6] do not align: 4 != 5", Error);
  const Var<float> stack = constant(randn<float>({2, 3, 4}, 3).to(gpu));
  CHECK_THROWS_WITH_AS(matmul(stack, constant(randn<float>({3, 4, 5}, 4).to(gpu))),
                       doctest::Contains("cannot be broadcast together"), Error);
}

TEST_CASE("matmul refuses operands on two devices, naming both") {
  const Var<float> on_gpu = constant(randn<float>({3, 4}, 1).to(gpu));
  const Var<float> on_cpu = constant(randn<float>({4, 2}, 2));
  CHECK_THROWS_WITH_AS(matmul(on_cpu, on_gpu),
                       doctest::Contains("matmul: input 0 is on cpu but input 1 is on cuda:0"), Error);
  CHECK_THROWS_WITH_AS(matmul(on_gpu, on_cpu),
                       doctest::Contains("matmul: input 0 is on cuda:0 but input 1 is on cpu"), Error);
}

TEST_CASE("cuda::gemm rejects bad arguments, naming the problem") {
  Tensor<float> m({4, 4}, gpu);
  const cuda::GemmArgs square{.dtype = DType::f32, .M = 4, .N = 4, .K = 4, .batch = 1, .a = {m.data(), 4},
                              .b = {m.data(), 4}, .c = {m.data(), 4}};
  cuda::GemmArgs g = square;
  g.a.ld = 3;
  CHECK_THROWS_WITH_AS(cuda::gemm(g, 0), doctest::Contains("gemm: a leading dimension is shorter than its matrix's"),
                       Error);
  CHECK_THROWS_WITH_AS(cuda::gemm(g, 0), doctest::Contains("A stored [4, 4] with lda 3"), Error);
  g = square;
  g.dtype = DType::i32;
  CHECK_THROWS_WITH_AS(cuda::gemm(g, 0), "gemm: no GPU GEMM for dtype i32", Error);
  g = square;
  g.batch = 2;
  g.c.batch_stride = 2;
  CHECK_THROWS_WITH_AS(cuda::gemm(g, 0), doctest::Contains("gemm: the output matrices overlap"), Error);
  g = square;
  g.gelu_input = m.data();  // without a bias
  CHECK_THROWS_WITH_AS(cuda::gemm(g, 0), doctest::Contains("gemm: the GELU epilogue needs a bias"), Error);
  g = square;
  g.bias_gradient = m.data();  // without the GELU-derivative epilogue
  CHECK_THROWS_WITH_AS(cuda::gemm(g, 0), doctest::Contains("gemm: a bias gradient comes only with"), Error);
  g = square;
  g.K = -1;
  CHECK_THROWS_WITH_AS(cuda::gemm(g, 0), doctest::Contains("gemm: negative size"), Error);
  CHECK_THROWS_WITH_AS(cuda::gemm(square, cuda::device_count()), doctest::Contains("does not exist"), Error);
}

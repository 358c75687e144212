#include <doctest/doctest.h>

#include "tapegrad/ops/detail/broadcast.hpp"
#include "tapegrad/ops/detail/gemm.hpp"
#include "tapegrad/ops/detail/gemm_choice.hpp"
#include "support.hpp"
#include "tapegrad/tensor/host_memory.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::check_close;
using test::Tolerance;

namespace {

// Against a double reference from the same (rounded) inputs only the f32 accumulation and the final rounding to T
// differ; double against double only the order of summation.
template <class T> constexpr Tolerance tolerance{};
template <> constexpr Tolerance tolerance<double>{1e-12, 1e-12};
template <> constexpr Tolerance tolerance<float>{1e-5, 1e-4};
template <> constexpr Tolerance tolerance<bf16>{1e-2, 1e-3};
template <> constexpr Tolerance tolerance<f16>{2e-3, 1e-3};

// The product by definition, in double: vectors made matrices, both operands expanded to the broadcast batch,
// then a triple loop. The result is [batch..., M, N] (vector axes kept), in the same element order as matmul's.
Tensor<double> reference(const Tensor<double>& a, const Tensor<double>& b) {
  const Tensor<double> a2 = a.rank() == 1 ? a.reshape({1, a.dim(0)}) : a;
  const Tensor<double> b2 = b.rank() == 1 ? b.reshape({b.dim(0), 1}) : b;
  const std::int64_t M = a2.dim(-2), K = a2.dim(-1), N = b2.dim(-1);
  auto batch_of = [](const Tensor<double>& t) {
    std::vector<std::int64_t> dims = t.shape().to_vector();
    dims.resize(dims.size() - 2);
    return Shape(dims);
  };
  const std::vector<std::int64_t> batch = broadcast_shapes(batch_of(a2), batch_of(b2), "reference").to_vector();
  auto with = [&](std::int64_t r, std::int64_t c) {
    std::vector<std::int64_t> d = batch;
    d.push_back(r);
    d.push_back(c);
    return Shape(d);
  };
  const Tensor<double> ea = expand_to(a2, with(M, K)), eb = expand_to(b2, with(K, N));
  Tensor<double> c = zeros<double>(with(M, N));
  for (std::int64_t m = 0; m < c.numel() / (M * N); ++m) {
    for (std::int64_t i = 0; i < M; ++i) {
      for (std::int64_t j = 0; j < N; ++j) {
        double sum = 0;
        for (std::int64_t k = 0; k < K; ++k) sum += ea.flat((m * M + i) * K + k) * eb.flat((m * K + k) * N + j);
        c.flat((m * M + i) * N + j) = sum;
      }
    }
  }
  return c;
}

Var<double> matmul_of_inputs(const std::vector<Var<double>>& in) { return matmul(in[0], in[1]); }

struct Case {
  Shape a, b, out;
};
// 2-D with odd sizes, batched, broadcast batches (either side shared, or both broadcast), and vector operands.
const Case cases[] = {
    {{7, 13}, {13, 5}, {7, 5}},
    {{5, 1}, {1, 3}, {5, 3}},
    {{3, 4, 5}, {3, 5, 2}, {3, 4, 2}},
    {{2, 3, 4}, {4, 5}, {2, 3, 5}},
    {{3, 4}, {2, 4, 5}, {2, 3, 5}},
    {{2, 1, 3, 4}, {3, 4, 5}, {2, 3, 3, 5}},
    {{4}, {4, 3}, {3}},
    {{3, 4}, {4}, {3}},
    {{4}, {4}, {}},
    {{2, 3, 4}, {4}, {2, 3}},
    {{4}, {2, 4, 3}, {2, 3}},
};

}  // namespace

TEST_CASE("matmul follows numpy shapes and values, broadcasting batch axes and dropping vector axes") {
  std::uint64_t seed = 10;
  for (const Case& c : cases) {
    CAPTURE(c.a);
    CAPTURE(c.b);
    const Tensor<double> a = randn<double>(c.a, seed++), b = randn<double>(c.b, seed++);
    const Var<double> y = matmul(constant(a), constant(b));
    CHECK(y.shape() == c.out);
    check_close(y.value(), reference(a, b).reshape(c.out), tolerance<double>);
  }
}

TEST_CASE("matmul passes gradcheck for matrices, stacks, broadcast stacks and vectors") {
  std::uint64_t seed = 100;
  for (const Case& c : cases) {
    CAPTURE(c.a);
    CAPTURE(c.b);
    CHECK(gradcheck(matmul_of_inputs, {randn<double>(c.a, seed), randn<double>(c.b, seed + 1)}));
    seed += 2;
  }
}

TEST_CASE("matmul of products large enough for BLAS matches the reference") {
  // 96·80·72 multiply-adds: past blas_min_work, so f32 and f64 take the CBLAS path when there is one.
  const Tensor<double> a = randn<double>({2, 96, 72}, 7), b = randn<double>({72, 80}, 8);
  REQUIRE(96 * 80 * 72 >= blas_min_work);
  const Tensor<double> expected = reference(a, b);
  check_close(matmul(constant(a), constant(b)).value(), expected, tolerance<double>);
  check_close(matmul(constant(cast<float>(a)), constant(cast<float>(b))).value(), expected, tolerance<float>);
  CHECK(gradcheck(matmul_of_inputs, {a, b}, {.fast_mode = true}));
}

TEST_CASE("matmul records one node, and none under NoGradGuard") {
  Tape tape;
  TapeScope scope(tape);
  auto a = param(randn<double>({3, 4}, 1)), b = param(randn<double>({4, 2}, 2));
  Var<double> y = matmul(a, b);
  CHECK(tape.size() == 1);
  CHECK(y.requires_grad());
  {
    NoGradGuard no_grad;
    CHECK_FALSE(matmul(a, b).requires_grad());
  }
  CHECK(tape.size() == 1);
}

TEST_CASE("matmul computes only the gradients asked for") {
  Tape tape;
  TapeScope scope(tape);
  const Tensor<double> av = randn<double>({3, 4}, 3), bv = randn<double>({4, 2}, 4);
  auto a = param(av);
  auto b = constant(bv);
  const Tensor<double> dy = randn<double>({3, 2}, 5);
  backward(matmul(a, b), dy);
  CHECK_FALSE(b.grad().defined());
  // dA = dY · Bᵀ
  Tensor<double> bt({2, 4});
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 2; ++j) bt(j, i) = bv(i, j);
  }
  check_close(a.grad(), reference(dy, bt), tolerance<double>);
}

TEST_CASE("matmul accepts lazy expressions as operands") {
  Tape tape;
  TapeScope scope(tape);
  auto a = param(randn<double>({3, 4}, 1)), b = param(randn<double>({4, 2}, 2));
  Var<double> y = matmul(a * 2.0, b * b);
  CHECK(tape.size() == 3);
  const Var<double> a2 = a * 2.0, bb = b * b;
  check_close(y.value(), reference(a2.value(), bb.value()), tolerance<double>);
  CHECK(gradcheck([](const std::vector<Var<double>>& in) { return matmul(in[0] * in[0], in[1]); },
                  {a.value(), b.value()}));
}

TEST_CASE("matmul with empty axes gives zeros, and zero gradients to matrices no output reads") {
  Tape tape;
  TapeScope scope(tape);
  auto a = param(randn<double>({2, 0}, 1)), b = param(randn<double>({0, 3}, 2));
  Var<double> y = matmul(a, b);  // an empty sum
  CHECK(y.shape() == Shape{2, 3});
  check_close(y.value(), zeros<double>({2, 3}), tolerance<double>);

  auto c = param(randn<double>({1, 2, 3}, 3)), d = param(randn<double>({0, 3, 4}, 4));
  Var<double> z = matmul(c, d);
  CHECK(z.shape() == Shape{0, 2, 4});
  backward(z, zeros<double>({0, 2, 4}));
  REQUIRE(c.grad().defined());
  check_close(c.grad(), zeros<double>({1, 2, 3}), tolerance<double>);
  CHECK(d.grad().shape() == Shape{0, 3, 4});
}

TEST_CASE("matmul errors name the op and both shapes") {
  auto v = [](Shape s) { return constant(randn<double>(s, 1)); };
  CHECK_THROWS_WITH_AS(matmul(v({2, 3}), v({4, 5})), "matmul: shapes [2, 3] and [4, 5] do not align: 3 != 4",
                       tapegrad::Error);
  CHECK_THROWS_WITH_AS(matmul(v({3}), v({4})), "matmul: shapes [3] and [4] do not align: 3 != 4", tapegrad::Error);
  CHECK_THROWS_WITH_AS(matmul(v({2, 5, 3}), v({5})), "matmul: shapes [2, 5, 3] and [5] do not align: 3 != 5",
                       tapegrad::Error);
  CHECK_THROWS_WITH_AS(matmul(v({}), v({3, 4})),
                       doctest::Contains("matmul: both operands need at least one dimension, got shapes [] and [3, 4]"),
                       tapegrad::Error);
  CHECK_THROWS_WITH_AS(
      matmul(v({2, 3, 4}), v({5, 4, 6})),
      doctest::Contains("matmul: batch dimensions [2] and [5] of shapes [2, 3, 4] and [5, 4, 6] cannot be broadcast"),
      tapegrad::Error);
}

// With a bias (every shape whose right operand is a matrix), it is added before the one rounding.
TEST_CASE_TEMPLATE("matmul in low precision matches double forward and backward, with a bias and without", T, float,
                   bf16, f16) {
  const Shape shapes[][2] = {{{2, 1, 7, 33}, {3, 33, 5}}, {{64, 48}, {48, 40}}, {{33}, {2, 33, 9}}};
  for (const auto& [sa, sb] : shapes) {
    for (const bool with_bias : {false, true}) {
      CAPTURE(sa);
      CAPTURE(sb);
      CAPTURE(with_bias);
      Tape tape;
      TapeScope scope(tape);
      auto a = param(randn<T>(sa, 21)), b = param(randn<T>(sb, 22)), bias = param(randn<T>({sb.dim(-1)}, 24));
      auto a64 = param(cast<double>(a.value())), b64 = param(cast<double>(b.value())),
           bias64 = param(cast<double>(bias.value()));
      Var<T> y = with_bias ? matmul(a, b, bias) : matmul(a, b);
      Var<double> y64 = with_bias ? matmul(a64, b64, bias64) : matmul(a64, b64);
      check_close(y.value(), y64.value(), tolerance<T>);

      const Tensor<T> dy = randn<T>(y.shape(), 23);
      backward(y, dy);
      backward(y64, cast<double>(dy));
      check_close(a.grad(), a64.grad(), tolerance<T>);
      check_close(b.grad(), b64.grad(), tolerance<T>);
      if (with_bias) check_close(bias.grad(), bias64.grad(), tolerance<T>);
    }
  }
}

TEST_CASE("matmul with a bias is one node holding no product, equal to matmul + bias, twice differentiable") {
  const Shape shapes[][2] = {{{7, 13}, {13, 5}}, {{2, 3, 4}, {4, 6}}, {{3, 4, 5}, {3, 5, 2}}, {{4}, {4, 3}}};
  for (const auto& [sa, sb] : shapes) {
    CAPTURE(sa);
    CAPTURE(sb);
    const Tensor<double> a = randn<double>(sa, 41), b = randn<double>(sb, 42), bias = randn<double>({sb.dim(-1)}, 43);
    const auto with_bias = [](const std::vector<Var<double>>& in) { return matmul(in[0], in[1], in[2]); };
    CHECK(gradcheck(with_bias, {a, b, bias}));
    CHECK(gradgradcheck(with_bias, {a, b, bias}));
    Tape tape;
    TapeScope scope(tape);
    auto av = param(a), bv = param(b), biasv = param(bias);
    Var<double> y = matmul(av, bv, biasv);
    CHECK(tape.size() == 1);
    const Tensor<double> dy = randn<double>(y.shape(), 44);
    backward(y, dy);
    auto a2 = param(a), b2 = param(b), bias2 = param(bias);
    Var<double> y2 = matmul(a2, b2) + bias2;
    backward(y2, dy);
    check_close(y.value(), y2.value(), tolerance<double>);
    check_close(av.grad(), a2.grad(), tolerance<double>);
    check_close(bv.grad(), b2.grad(), tolerance<double>);
    check_close(biasv.grad(), bias2.grad(), tolerance<double>);
  }
  // The product matmul + bias would keep beside its output is never made: the node holds its output alone.
  const Var<float> x = param(randn<float>({256, 64}, 45)), w = param(randn<float>({64, 512}, 46)),
                   bias = param(randn<float>({512}, 47));
  const std::int64_t before = host_memory_stats().in_use_bytes;
  const Var<float> y = matmul(x, w, bias);
  CHECK(host_memory_stats().in_use_bytes - before == 256 * 512 * std::int64_t{sizeof(float)});
  Tape::active().clear();
}

TEST_CASE("matmul's bias must be [N] of a matrix right operand, and the error names the shapes") {
  auto v = [](Shape s) { return constant(randn<double>(s, 1)); };
  CHECK_THROWS_WITH_AS(matmul(v({2, 3}), v({3, 4}), v({3})),
                       "matmul: the bias has shape [3] but the product of [2, 3] and [3, 4] has shape [2, 4]: a bias "
                       "is [N], added to every row of a matrix right operand's product",
                       tapegrad::Error);
  CHECK_THROWS_WITH_AS(matmul(v({2, 3}), v({3}), v({1})), doctest::Contains("has shape [2]: a bias is [N]"),
                       tapegrad::Error);
  CHECK_THROWS_WITH_AS(matmul(v({2, 3}), v({4, 5}), v({5})), doctest::Contains("do not align: 3 != 4"),
                       tapegrad::Error);
}

// ---- the raw GEMM ----------------------------------------------------------------------------------------------

namespace {

// C = alpha · op(A) · op(B) + beta · C in double, for row-major matrices with leading dimensions.
Tensor<double> reference_gemm(Transpose ta, Transpose tb, std::int64_t M, std::int64_t N, std::int64_t K, double alpha,
                              const Tensor<double>& a, std::int64_t lda, const Tensor<double>& b, std::int64_t ldb,
                              double beta, Tensor<double> c, std::int64_t ldc) {
  c = c.clone();
  for (std::int64_t i = 0; i < M; ++i) {
    for (std::int64_t j = 0; j < N; ++j) {
      double sum = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double x = ta == Transpose::yes ? a.flat(k * lda + i) : a.flat(i * lda + k);
        const double y = tb == Transpose::yes ? b.flat(j * ldb + k) : b.flat(k * ldb + j);
        sum += x * y;
      }
      c.flat(i * ldc + j) = alpha * sum + beta * c.flat(i * ldc + j);
    }
  }
  return c;
}

// Checks gemm<T> against the double reference on operands stored with padded rows (ld = width + 3), with alpha
// and beta.
template <class T>
void check_gemm(Transpose ta, Transpose tb, std::int64_t M, std::int64_t N, std::int64_t K, GemmPath path) {
  const std::int64_t a_rows = ta == Transpose::yes ? K : M, a_cols = ta == Transpose::yes ? M : K;
  const std::int64_t b_rows = tb == Transpose::yes ? N : K, b_cols = tb == Transpose::yes ? K : N;
  const std::int64_t lda = a_cols + 3, ldb = b_cols + 3, ldc = N + 3;
  const Tensor<T> a = randn<T>({a_rows, lda}, 31), b = randn<T>({b_rows, ldb}, 32);
  Tensor<T> c = randn<T>({M, ldc}, 33);
  const Tensor<double> expected = reference_gemm(ta, tb, M, N, K, 0.5, cast<double>(a), lda, cast<double>(b), ldb,
                                                 -1.5, cast<double>(c), ldc);
  gemm<T>(ta, tb, M, N, K, compute_t<T>(0.5), a.data(), lda, b.data(), ldb, compute_t<T>(-1.5), c.data(), ldc, path);
  check_close(c, expected, tolerance<T>);
}

}  // namespace

TEST_CASE_TEMPLATE("gemm paths agree with the reference for every transpose, with strides, alpha and beta", T, float,
                   double) {
  // 67·45·129 multiply-adds: enough for the BLAS path to be the one `automatic` picks.
  std::vector<GemmPath> paths{GemmPath::automatic, GemmPath::eigen};
  if (gemm_has_blas()) paths.push_back(GemmPath::blas);
  for (GemmPath path : paths) {
    for (Transpose ta : {Transpose::no, Transpose::yes}) {
      for (Transpose tb : {Transpose::no, Transpose::yes}) {
        CAPTURE(static_cast<int>(path));
        CAPTURE(static_cast<int>(ta));
        CAPTURE(static_cast<int>(tb));
        check_gemm<T>(ta, tb, 67, 45, 129, path);
        check_gemm<T>(ta, tb, 5, 3, 7, path);
      }
    }
  }
}

TEST_CASE("gemm on the BLAS and the Eigen path give the same large product") {
  if (!gemm_has_blas()) return;
  const std::int64_t M = 150, N = 130, K = 140;
  const Tensor<float> a = randn<float>({K, M}, 41), b = randn<float>({K, N}, 42);
  Tensor<float> via_blas({M, N}), via_eigen({M, N});
  for (auto [path, c] : {std::pair{GemmPath::blas, via_blas}, std::pair{GemmPath::eigen, via_eigen}}) {
    gemm<float>(Transpose::yes, Transpose::no, M, N, K, 1.f, a.data(), M, b.data(), N, 0.f, c.data(), N, path);
  }
  check_close(via_blas, cast<double>(via_eigen), tolerance<float>);
}

TEST_CASE_TEMPLATE("gemm in bf16 and f16 accumulates in f32 and rounds once", T, bf16, f16) {
  for (Transpose ta : {Transpose::no, Transpose::yes}) {
    for (Transpose tb : {Transpose::no, Transpose::yes}) {
      check_gemm<T>(ta, tb, 67, 45, 129, GemmPath::automatic);
    }
  }
}

TEST_CASE("gemm with K = 0 scales C by beta, and checks its leading dimensions") {
  Tensor<double> c = randn<double>({2, 3}, 1);
  const Tensor<double> before = c.clone();
  gemm<double>(Transpose::no, Transpose::no, 2, 3, 0, 1.0, nullptr, 0, nullptr, 3, 2.0, c.data(), 3);
  for (std::int64_t i = 0; i < c.numel(); ++i) CHECK(c.flat(i) == 2.0 * before.flat(i));
  CHECK_THROWS_WITH_AS(
      gemm<double>(Transpose::no, Transpose::no, 2, 3, 4, 1.0, before.data(), 2, before.data(), 3, 0.0, c.data(), 3),
      doctest::Contains("gemm: leading dimensions lda 2"), tapegrad::Error);
}

TEST_CASE("gemm measures both engines once per shape, keeps the faster, and accumulates into C with beta") {
  if (!gemm_has_blas()) return;
  const std::int64_t M = 97, N = 83, K = 71;  // a shape no other case multiplies
  const Tensor<double> a = randn<double>({M, K}, 51), b = randn<double>({K, N}, 52), c0 = randn<double>({M, N}, 53);
  const auto product = [&](GemmPath path, double beta) {
    Tensor<double> c = c0.clone();
    gemm<double>(Transpose::no, Transpose::no, M, N, K, 1.0, a.data(), K, b.data(), N, beta, c.data(), N, path);
    return c;
  };
  const std::int64_t before = detail::measured_gemm_problems();
  const Tensor<double> first = product(GemmPath::automatic, 1.0);
  CHECK(detail::measured_gemm_problems() == before + 1);
  CHECK(test::bitwise_equal(product(GemmPath::automatic, 1.0), first));  // the engine kept: the same bits
  CHECK(detail::measured_gemm_problems() == before + 1);
  CHECK((test::bitwise_equal(first, product(GemmPath::eigen, 1.0)) ||
         test::bitwise_equal(first, product(GemmPath::blas, 1.0))));
  Tensor<double> without_c = product(GemmPath::eigen, 0.0);
  for (std::int64_t i = 0; i < without_c.numel(); ++i) without_c.flat(i) += c0.flat(i);
  check_close(first, without_c, {1e-12, 1e-12});
}

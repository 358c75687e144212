// nn::rope: the rotation against complex numbers in double (both pairings, a partial rotary dimension, heads left
// unturned, an offset, both layouts), gradients and second derivatives in double, attention scores that depend only
// on the distance between positions, low precision against double, and the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <complex>
#include <string>
#include <vector>

#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;

namespace {

using test::fresh_seed;

// rope written with std::complex: pair i of head h at position s is multiplied by e^{i·angle}. x in [B, S, H, D]
// (bshd) or [B, H, S, D] (bhsd).
Tensor<double> reference(const Tensor<double>& x, const nn::RopeOptions& o) {
  const bool heads_first = o.layout == nn::AttentionLayout::bhsd;
  const std::int64_t B = x.dim(0), S = heads_first ? x.dim(2) : x.dim(1), H = heads_first ? x.dim(1) : x.dim(2),
                     D = x.dim(3);
  const std::int64_t rotary = o.rotary_dim ? o.rotary_dim : D, period = o.head_period ? o.head_period : H;
  const std::int64_t turned = o.rotated_heads < 0 ? period : o.rotated_heads;
  Tensor<double> out = x.clone();
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t s = 0; s < S; ++s) {
      for (std::int64_t h = 0; h < H; ++h) {
        if (h % period >= turned) continue;
        for (std::int64_t i = 0; i < rotary / 2; ++i) {
          const std::int64_t first = o.interleaved ? 2 * i : i, second = o.interleaved ? 2 * i + 1 : i + rotary / 2;
          double& a = heads_first ? out(b, h, s, first) : out(b, s, h, first);
          double& c = heads_first ? out(b, h, s, second) : out(b, s, h, second);
          const double angle = static_cast<double>(s + o.position_offset) *
                               std::pow(o.base, -2.0 * static_cast<double>(i) / static_cast<double>(rotary));
          const std::complex<double> turned_pair = std::complex<double>(a, c) * std::polar(1.0, angle);
          a = turned_pair.real();
          c = turned_pair.imag();
        }
      }
    }
  }
  return out;
}

struct Case {
  const char* name;
  Shape shape;
  nn::RopeOptions options{};
};

std::vector<Case> cases() {
  return {
      {"all features, rotate-half pairs", {2, 7, 3, 8}},
      {"interleaved pairs", {2, 7, 3, 8}, {.interleaved = true}},
      {"partial rotary dimension, odd head size", {1, 5, 2, 9}, {.rotary_dim = 4}},
      {"the first heads only (a fused qkv's q and k)", {2, 4, 5, 6}, {.rotated_heads = 3}},
      {"the first heads of each period (a qkv packed by groups)", {2, 3, 8, 6}, {.rotated_heads = 3, .head_period = 4}},
      {"offset and base", {1, 6, 2, 4}, {.base = 500, .position_offset = 17}},
      {"bhsd", {2, 3, 7, 6}, {.rotary_dim = 4, .layout = nn::AttentionLayout::bhsd}},
  };
}

}  // namespace

TEST_CASE("rope turns each pair of features by its position's angle, in every option") {
  for (const Case& c : cases()) {
    const std::string name = c.name;
    CAPTURE(name);
    const Tensor<double> x = randn<double>(c.shape, fresh_seed());
    test::check_close(nn::rope(constant(x), c.options).value(), reference(x, c.options), {1e-14, 1e-14});
  }
}

TEST_CASE("rope's gradients and second derivatives pass gradcheck and gradgradcheck in double") {
  for (const Case& c : cases()) {
    const std::uint64_t seed = fresh_seed();
    const std::string name = c.name;
    CAPTURE(name);
    CAPTURE(seed);
    const Tensor<double> w = randn<double>(c.shape, seed + 1);
    // Squared, so that the second derivative is not zero.
    const GradcheckFunction f = [&](const std::vector<Var<double>>& in) {
      const Var<double> y = nn::rope(in[0], c.options);
      return sum(y * y * constant(w));
    };
    CHECK(gradcheck(f, {randn<double>(c.shape, seed)}));
    CHECK(gradgradcheck(f, {randn<double>(c.shape, seed)}, {.fast_mode = true}));
  }
}

TEST_CASE("rope makes the score of a query and a key depend only on how far apart they are") {
  const Tensor<double> q = randn<double>({1, 1, 1, 16}, 1), k = randn<double>({1, 1, 1, 16}, 2);
  const auto score = [&](std::int64_t q_position, std::int64_t k_position) {
    const Tensor<double> qr = nn::rope(constant(q), {.position_offset = q_position}).value();
    const Tensor<double> kr = nn::rope(constant(k), {.position_offset = k_position}).value();
    double dot = 0;
    for (std::int64_t d = 0; d < 16; ++d) dot += qr.flat(d) * kr.flat(d);
    return dot;
  };
  CHECK(score(10, 3) == doctest::Approx(score(107, 100)).epsilon(1e-12));
  CHECK(score(10, 3) != doctest::Approx(score(10, 4)).epsilon(1e-6));
}

// bf16/f16/f32 against double on the same inputs: each output is two products and a sum in f32 from cosines and
// sines rounded to f32, then rounded to T once: half a T ulp plus a few f32 ulps.
TEST_CASE_TEMPLATE("rope in bf16, f16 and f32 matches double on the same inputs", T, bf16, f16, float) {
  const double unit = std::is_same_v<T, bf16> ? 0x1p-8 : std::is_same_v<T, f16> ? 0x1p-11 : 0x1p-23;
  const Tensor<T> x = randn<T>({2, 33, 4, 64}, fresh_seed());
  const nn::RopeOptions options{.rotary_dim = 32, .rotated_heads = 3};
  test::check_close(nn::rope(constant(x), options).value(), nn::rope(constant(cast<double>(x)), options).value(),
                    {unit, 1e-6});
}

TEST_CASE("rope names what does not fit") {
  const Var<float> x = constant(randn<float>({2, 5, 3, 6}, 1));
  CHECK_THROWS_WITH_AS(nn::rope(x, {.rotary_dim = 5}),
                       "rope: rotary_dim 5 should be even, positive and at most the head size 6 of x [2, 5, 3, 6]",
                       Error);
  CHECK_THROWS_WITH_AS(nn::rope(x, {.rotated_heads = 4}),
                       "rope: rotated_heads 4 should be -1 (all) or in [0, 3] for x [2, 5, 3, 6]", Error);
  CHECK_THROWS_WITH_AS(nn::rope(x, {.head_period = 2}),
                       "rope: head_period 2 should divide the 3 heads of x [2, 5, 3, 6]", Error);
  CHECK_THROWS_WITH_AS(nn::rope(constant(randn<float>({5, 6}, 2))),
                       "rope: x [5, 6] should be [..., S, heads, D]", Error);
  CHECK_THROWS_WITH_AS(nn::rope(x, {.base = -1}), "rope: base must be positive and finite, got -1", Error);
}

// FP8 attention on cuDNN's FP8 engines (cuda/cudnn_attention.hpp) against a double reference that quantizes where
// the graphs do: q, k, v and o in e4m3, the probabilities' copy in e4m3 under scale_s, the scores' gradient and the
// backward's dout, dq, dk, dv in e5m2 (the hybrid format). The tolerances are those roundings. The kernels' P comes
// from the GPU's fast exp and log (the log-sum-exp within 2e-4 of its size, P within 1e-3). The forward's kernel
// quantizes each probability before its row's sum is known (exp(s - the running max) · scale_s, divided by the sum
// at the end, as a flash kernel must), so o is held to the exact probabilities: each term within 2^-4 of its size
// (e4m3's half spacing) or e4m3's subnormal half step. The backward quantizes P from the log-sum-exp as the graph
// says; where P's error moves P·scale_s (or dS·scale_dp) across a rounding boundary, the kernel's code may be the
// reference's neighbour, so each such term adds its code's spacing × the factor it multiplies to the bound of the
// sums it enters (ambiguity()). An output is within its bound plus half its own code's spacing (e4m3: 2^-4 of its
// value, e5m2: 2^-3). The backward's gradients have 2 % of their tensor's largest value more: Hopper's FP8 tensor
// cores keep fewer bits than f32 between partial sums, which moves dS (and so its codes) by more than P's error.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gpu_reference.hpp"
#include "tapegrad/cuda/cudnn_attention.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::gpu;

namespace {

const Device host = Device::cpu();
constexpr auto e4m3 = fp8::Format::e4m3;
constexpr auto e5m2 = fp8::Format::e5m2;

// A tensor's codes (bshd rows), the values they stand for (code / scale), on the host.
template <fp8::Format F> struct Codes {
  std::vector<std::uint8_t> bits;
  std::vector<double> values;
  float scale = 1;
};

template <fp8::Format F> double value_of(std::uint8_t bits, float scale) {
  return static_cast<double>(fp8::to_float<F>(bits)) / scale;
}

template <fp8::Format F> Codes<F> random_codes(std::size_t n, float scale, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  Codes<F> c{.bits = std::vector<std::uint8_t>(n), .values = std::vector<double>(n), .scale = scale};
  for (std::size_t i = 0; i < n; ++i) {
    c.bits[i] = fp8::from_double<F>(normal(rng) * scale);
    c.values[i] = value_of<F>(c.bits[i], scale);
  }
  return c;
}

template <fp8::Format F> double rounded(double x, float scale) {
  return value_of<F>(fp8::from_double<F>(x * scale), scale);
}

// How far apart the codes of x·scale can be when x is known within ±error: 0 unless a rounding boundary is in reach.
template <fp8::Format F> double ambiguity(double x, double error, float scale) {
  return std::fabs(value_of<F>(fp8::from_double<F>((x + error) * scale), scale) -
                   value_of<F>(fp8::from_double<F>((x - error) * scale), scale));
}

template <class T> Tensor<T> on_gpu(const std::vector<std::uint8_t>& bits) {
  Tensor<T> t(Shape{static_cast<std::int64_t>(bits.size())}, host);
  for (std::size_t i = 0; i < bits.size(); ++i) t.flat(static_cast<std::int64_t>(i)) = T{bits[i]};
  return t.to(gpu);
}

template <class T> std::vector<std::uint8_t> bits_of(const Tensor<T>& t) {
  const Tensor<T> h = t.to(host);
  std::vector<std::uint8_t> bits(static_cast<std::size_t>(h.numel()));
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = h.flat(static_cast<std::int64_t>(i)).bits;
  return bits;
}

// One f32 per 16 bytes of device memory: slot i at data() + 4·i (cuDNN's graphs declare their scalars aligned so).
struct Slots {
  Tensor<float> memory;
  explicit Slots(const std::vector<float>& values) : memory(Shape{4 * static_cast<std::int64_t>(values.size())}, host) {
    for (std::size_t i = 0; i < values.size(); ++i) memory.flat(4 * static_cast<std::int64_t>(i)) = values[i];
    memory = memory.to(gpu);
  }
  float* at(int i) { return memory.data() + 4 * i; }
  float read(int i) const { return memory.to(host).flat(4 * i); }
};

struct Case {
  std::int64_t B, Hq, Hkv, S, D;
  bool causal;
};

// The reference of one case: forward and backward in double from the same codes the kernels read.
struct Reference {
  std::vector<double> o, log_sums, dq, dk, dv;
  std::vector<double> o_bound, dq_bound, dk_bound, dv_bound;  // (check_close's)
  double amax_s = 0, amax_dp = 0;
};

// |got - want| ≤ half·(|want| + bound) + bound + absolute for every element (half: the output code's relative half
// spacing; bound: the ambiguous terms' sum); the count outside and the worst are reported.
void check_close(const char* what, const std::vector<double>& got, const std::vector<double>& want,
                 const std::vector<double>& bound, double half, double absolute) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, worst = 0;
  double worst_excess = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double excess = std::fabs(got[i] - want[i]) - (half * (std::fabs(want[i]) + bound[i]) + bound[i] + absolute);
    if (excess > 0) ++bad;
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  INFO(what, ": ", bad, " of ", got.size(), " elements outside; worst at ", worst, ": ", got[worst], " against ",
       want[worst], " (bound ", bound[worst], ")");
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("FP8 attention on cuDNN matches a double reference that quantizes where its graphs do") {
  for (const Case c : {Case{2, 4, 4, 256, 128, false}, Case{2, 4, 2, 256, 128, true}, Case{1, 4, 1, 200, 128, true}}) {
    CAPTURE(c.Hkv);
    CAPTURE(c.S);
    CAPTURE(c.causal);
    const std::int64_t B = c.B, Hq = c.Hq, Hkv = c.Hkv, S = c.S, D = c.D, G = Hq / Hkv;
    attention::Problem p{.batch = B, .q_heads = Hq, .kv_heads = Hkv, .Sq = S, .Sk = S, .D = D, .Dv = D,
                         .q = {.batch = S * Hq * D, .head = D, .row = Hq * D},
                         .k = {.batch = S * Hkv * D, .head = D, .row = Hkv * D},
                         .v = {.batch = S * Hkv * D, .head = D, .row = Hkv * D},
                         .o = {.batch = S * Hq * D, .head = D, .row = Hq * D}};
    p.scale = 1 / std::sqrt(static_cast<double>(D));
    p.causal = c.causal;
    const std::string refusal = cuda::cudnn_attention_fp8_refusal(p, true, DType::f8e5m2, 0);
    if (!refusal.empty()) {
      // (cuDNN before 9.7 takes no FP8 sequence but multiples of 128)
      REQUIRE_MESSAGE(S % 128 != 0, refusal);
      MESSAGE("not run: ", refusal);
      continue;
    }
    std::mt19937_64 rng(1000 + static_cast<std::uint64_t>(S * 8 + Hkv * 2 + c.causal));
    const auto q_at = [&](std::int64_t b, std::int64_t h, std::int64_t i) { return ((b * S + i) * Hq + h) * D; };
    const auto kv_at = [&](std::int64_t b, std::int64_t h, std::int64_t j) { return ((b * S + j) * Hkv + h) * D; };
    const auto nq = static_cast<std::size_t>(B * S * Hq * D), nkv = static_cast<std::size_t>(B * S * Hkv * D);
    const Codes<e4m3> q = random_codes<e4m3>(nq, 16, rng), k = random_codes<e4m3>(nkv, 8, rng),
                      v = random_codes<e4m3>(nkv, 32, rng);
    const Codes<e5m2> dout = random_codes<e5m2>(nq, 64, rng);
    // scale_s: P ≤ 1 fills e4m3's range; o, dS and the gradients have room to spare at these scales
    const float scale_s = 448, scale_o = 64, scale_dp = 2048, scale_dq = 64, scale_dk = 64, scale_dv = 64;

    // Forward: the rows' log-sum-exp, P and o; then o as its codes give it back (the backward reads those).
    Reference r{.o = std::vector<double>(nq), .log_sums = std::vector<double>(static_cast<std::size_t>(B * Hq * S)),
                .dq = std::vector<double>(nq), .dk = std::vector<double>(nkv), .dv = std::vector<double>(nkv),
                .o_bound = std::vector<double>(nq), .dq_bound = std::vector<double>(nq),
                .dk_bound = std::vector<double>(nkv), .dv_bound = std::vector<double>(nkv)};
    constexpr double p_error = 1e-3;  // P's relative error in the kernels
    std::vector<double> probabilities(static_cast<std::size_t>(B * Hq * S * S));
    const auto p_at = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
      return static_cast<std::size_t>(((b * Hq + h) * S + i) * S + j);
    };
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < Hq; ++h) {
        for (std::int64_t i = 0; i < S; ++i) {
          const std::int64_t end = c.causal ? i + 1 : S;
          std::vector<double> s(static_cast<std::size_t>(end));
          double max = -INFINITY;
          for (std::int64_t j = 0; j < end; ++j) {
            double dot = 0;
            for (std::int64_t d = 0; d < D; ++d) dot += q.values[q_at(b, h, i) + d] * k.values[kv_at(b, h / G, j) + d];
            s[j] = dot * p.scale;
            max = std::max(max, s[j]);
          }
          double sum = 0;
          for (const double x : s) sum += std::exp(x - max);
          const double log_sum = max + std::log(sum);
          r.log_sums[static_cast<std::size_t>((b * Hq + h) * S + i)] = log_sum;
          for (std::int64_t j = 0; j < end; ++j) {
            const double pr = std::exp(s[j] - log_sum);
            probabilities[p_at(b, h, i, j)] = pr;
            r.amax_s = std::max(r.amax_s, pr);
            const double unsure = (0.0625 + p_error) * pr + std::ldexp(1.0, -10) / scale_s;
            for (std::int64_t d = 0; d < D; ++d) {
              r.o[q_at(b, h, i) + d] += pr * v.values[kv_at(b, h / G, j) + d];
              r.o_bound[q_at(b, h, i) + d] += unsure * std::fabs(v.values[kv_at(b, h / G, j) + d]);
            }
          }
        }
      }
    }
    double amax_o_low = 0, amax_o_high = 0;  // (the bounds of o's amax)
    for (std::size_t i = 0; i < nq; ++i) {
      amax_o_low = std::max(amax_o_low, std::fabs(r.o[i]) - r.o_bound[i]);
      amax_o_high = std::max(amax_o_high, std::fabs(r.o[i]) + r.o_bound[i]);
    }

    const Tensor<f8e4m3> q_gpu = on_gpu<f8e4m3>(q.bits), k_gpu = on_gpu<f8e4m3>(k.bits), v_gpu = on_gpu<f8e4m3>(v.bits);
    Tensor<f8e4m3> o_gpu(Shape{static_cast<std::int64_t>(nq)}, gpu);
    Tensor<float> log_sums_gpu(Shape{B * Hq * S}, gpu);
    // slots: descale q, k, v; scale_s, descale_s; scale_o, descale_o; descale_dout, scale_dp, descale_dp;
    // scale_dq, scale_dk, scale_dv
    Slots scales({1 / q.scale, 1 / k.scale, 1 / v.scale, scale_s, 1 / scale_s, scale_o, 1 / scale_o, 1 / dout.scale,
                  scale_dp, 1 / scale_dp, scale_dq, scale_dk, scale_dv});
    Slots amaxes({-1, -1, -1, -1, -1, -1});  // (set by the calls: s, o; dp, dq, dk, dv)
    const cuda::Fp8AttentionScales s{.descale_q = scales.at(0), .descale_k = scales.at(1), .descale_v = scales.at(2),
                                     .scale_s = scales.at(3), .descale_s = scales.at(4), .scale_o = scales.at(5),
                                     .descale_o = scales.at(6), .descale_dout = scales.at(7),
                                     .scale_dp = scales.at(8), .descale_dp = scales.at(9), .scale_dq = scales.at(10),
                                     .scale_dk = scales.at(11), .scale_dv = scales.at(12)};
    const cuda::Fp8AttentionAmaxes a{.s = amaxes.at(0), .o = amaxes.at(1), .dp = amaxes.at(2), .dq = amaxes.at(3),
                                     .dk = amaxes.at(4), .dv = amaxes.at(5)};
    REQUIRE(cuda::cudnn_attention_fp8_forward(p, q_gpu.data(), k_gpu.data(), v_gpu.data(), o_gpu.data(),
                                              log_sums_gpu.data(), s, a, 0));
    const std::vector<std::uint8_t> o_bits = bits_of(o_gpu);
    std::vector<double> o(nq);
    for (std::size_t i = 0; i < nq; ++i) o[i] = value_of<e4m3>(o_bits[i], scale_o);
    check_close("o", o, r.o, r.o_bound, 0.0625, 0.5 * std::ldexp(1.0, -9) / scale_o);  // (+ e4m3's subnormal step)
    std::vector<double> log_sums(r.log_sums.size());
    const Tensor<float> log_sums_host = log_sums_gpu.to(host);
    for (std::size_t i = 0; i < log_sums.size(); ++i) log_sums[i] = log_sums_host.flat(static_cast<std::int64_t>(i));
    for (std::size_t i = 0; i < log_sums.size(); ++i) {
      INFO("log-sum-exp of row ", i, ": ", log_sums[i], " against ", r.log_sums[i]);
      REQUIRE(std::fabs(log_sums[i] - r.log_sums[i]) <= 2e-4 * (1 + std::fabs(r.log_sums[i])));
    }
    CHECK(amaxes.read(0) == doctest::Approx(r.amax_s).epsilon(1e-4));
    CHECK(amaxes.read(1) >= amax_o_low * (1 - 1e-5));
    CHECK(amaxes.read(1) <= amax_o_high * (1 + 1e-5));

    // Backward, from the forward's o codes: δ, dv = P8ᵀ·dout, dS = scale·P∘(dout·vᵀ − δ), dS's e5m2 copy, dq, dk.
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < Hq; ++h) {
        for (std::int64_t i = 0; i < S; ++i) {
          double delta = 0;
          for (std::int64_t d = 0; d < D; ++d) delta += dout.values[q_at(b, h, i) + d] * o[q_at(b, h, i) + d];
          const std::int64_t end = c.causal ? i + 1 : S;
          for (std::int64_t j = 0; j < end; ++j) {
            const double pr = probabilities[p_at(b, h, i, j)], p8 = rounded<e4m3>(pr, scale_s),
                         unsure = ambiguity<e4m3>(pr, p_error * pr, scale_s);
            double dp = 0;
            for (std::int64_t d = 0; d < D; ++d) {
              r.dv[kv_at(b, h / G, j) + d] += p8 * dout.values[q_at(b, h, i) + d];
              r.dv_bound[kv_at(b, h / G, j) + d] += unsure * std::fabs(dout.values[q_at(b, h, i) + d]);
              dp += dout.values[q_at(b, h, i) + d] * v.values[kv_at(b, h / G, j) + d];
            }
            const double ds = p.scale * pr * (dp - delta);
            r.amax_dp = std::max(r.amax_dp, std::fabs(ds));
            // (dS's error: P's, and f32's in dp - δ)
            const double ds8 = rounded<e5m2>(ds, scale_dp),
                         ds_unsure = ambiguity<e5m2>(
                             ds, p_error * std::fabs(ds) + 1e-5 * p.scale * pr * (std::fabs(dp) + std::fabs(delta)),
                             scale_dp);
            for (std::int64_t d = 0; d < D; ++d) {
              r.dq[q_at(b, h, i) + d] += ds8 * k.values[kv_at(b, h / G, j) + d];
              r.dk[kv_at(b, h / G, j) + d] += ds8 * q.values[q_at(b, h, i) + d];
              r.dq_bound[q_at(b, h, i) + d] += ds_unsure * std::fabs(k.values[kv_at(b, h / G, j) + d]);
              r.dk_bound[kv_at(b, h / G, j) + d] += ds_unsure * std::fabs(q.values[q_at(b, h, i) + d]);
            }
          }
        }
      }
    }
    const Tensor<f8e5m2> dout_gpu = on_gpu<f8e5m2>(dout.bits);
    const Shape q_shape{static_cast<std::int64_t>(nq)}, kv_shape{static_cast<std::int64_t>(nkv)};
    Tensor<f8e5m2> dq_gpu(q_shape, gpu), dk_gpu(kv_shape, gpu), dv_gpu(kv_shape, gpu);
    REQUIRE(cuda::cudnn_attention_fp8_backward(p, DType::f8e5m2, q_gpu.data(), k_gpu.data(), v_gpu.data(),
                                               o_gpu.data(), log_sums_gpu.data(), dout_gpu.data(), dq_gpu.data(),
                                               dk_gpu.data(), dv_gpu.data(), s, a, 0));
    const auto values = [](const Tensor<f8e5m2>& t, float scale) {
      std::vector<double> out;
      for (const std::uint8_t bits : bits_of(t)) out.push_back(value_of<e5m2>(bits, scale));
      return out;
    };
    const auto largest = [](const std::vector<double>& x) {
      double m = 0;
      for (const double e : x) m = std::max(m, std::fabs(e));
      return m;
    };
    check_close("dv", values(dv_gpu, scale_dv), r.dv, r.dv_bound, 0.125, 0.02 * largest(r.dv));
    check_close("dq", values(dq_gpu, scale_dq), r.dq, r.dq_bound, 0.125, 0.02 * largest(r.dq));
    check_close("dk", values(dk_gpu, scale_dk), r.dk, r.dk_bound, 0.125, 0.02 * largest(r.dk));
    CHECK(amaxes.read(2) == doctest::Approx(r.amax_dp).epsilon(0.01));
    CHECK(amaxes.read(3) == doctest::Approx(largest(r.dq)).epsilon(0.03));
    CHECK(amaxes.read(4) == doctest::Approx(largest(r.dk)).epsilon(0.03));
    CHECK(amaxes.read(5) == doctest::Approx(largest(r.dv)).epsilon(0.03));
  }
}

TEST_CASE("FP8 attention names what cuDNN's FP8 engines do not take") {
  attention::Problem p{.batch = 1, .q_heads = 2, .kv_heads = 2, .Sq = 128, .Sk = 128, .D = 64, .Dv = 64,
                       .q = {.batch = 128 * 2 * 64, .head = 64, .row = 2 * 64},
                       .k = {.batch = 128 * 2 * 64, .head = 64, .row = 2 * 64},
                       .v = {.batch = 128 * 2 * 64, .head = 64, .row = 2 * 64},
                       .o = {.batch = 128 * 2 * 64, .head = 64, .row = 2 * 64}};
  CHECK(cuda::cudnn_attention_fp8_refusal(p, true, DType::f8e5m2, 0).find("128 only") != std::string::npos);
  p.dropout = 0.1;
  CHECK(cuda::cudnn_attention_fp8_refusal(p, false, DType::f8e5m2, 0).find("dropout") != std::string::npos);
  p.dropout = 0;
  p.window_left = 16;
  CHECK(cuda::cudnn_attention_fp8_refusal(p, false, DType::f8e5m2, 0).find("window") != std::string::npos);
  p.window_left = -1;
  p.D = p.Dv = 72;  // (its rows, 72 bytes apart, do not start on 16 bytes either)
  CHECK(cuda::cudnn_attention_fp8_refusal(p, false, DType::f8e5m2, 0).find("16") != std::string::npos);
}

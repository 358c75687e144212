// nn::dot_product_attention, the fused node: every option against a reference written here in double loops
// (masks, bias, dropout drawn from rand_uniform of the seed), gradients by gradcheck in double, the recorded backward
// equal to the fused one, second derivatives (the fused second-order pass) by gradgradcheck and third ones (the
// composite's) through a gradient penalty, bf16/f16/f32 against double under written tolerances, memory linear in S
// for gradients and Hessian-vector products, the same bits on every thread count, and the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;

namespace {

using test::fresh_seed;

struct Case {
  const char* name;
  std::vector<std::int64_t> lead;  // batch axes
  std::int64_t Hq, Hkv, Sq, Sk, D, Dv;
  nn::AttentionOptions options{};
  std::vector<std::int64_t> bias_shape{};  // empty: no bias
  bool packed = false;                     // dot_product_attention_qkv (Sq = Sk, D = Dv)
};

std::int64_t batch_of(const Case& c) {
  std::int64_t n = 1;
  for (std::int64_t d : c.lead) n *= d;
  return n;
}

std::vector<std::int64_t> with(std::vector<std::int64_t> lead, std::initializer_list<std::int64_t> tail) {
  lead.insert(lead.end(), tail);
  return lead;
}

// Canonical operands [B, H, S, D] and the bias as the case shapes it.
struct Operands {
  Tensor<double> q, k, v, bias;
};

Operands draw(const Case& c, std::uint64_t seed) {
  const std::int64_t B = batch_of(c);
  Operands x{randn<double>({B, c.Hq, c.Sq, c.D}, seed), randn<double>({B, c.Hkv, c.Sk, c.D}, seed + 1),
             randn<double>({B, c.Hkv, c.Sk, c.Dv}, seed + 2), Tensor<double>()};
  if (!c.bias_shape.empty()) x.bias = randn<double>(Shape(c.bias_shape), seed + 3);
  return x;
}

// [B, H, S, D] -> the tensor the call takes (bhsd: the same values; bshd: S and H swapped).
template <class T> Tensor<T> arranged(const Case& c, const Tensor<T>& t) {
  const std::int64_t H = t.dim(1), S = t.dim(2), D = t.dim(3);
  if (c.options.layout == nn::AttentionLayout::bhsd) return t.reshape(Shape(with(c.lead, {H, S, D})));
  return permute(constant(t), {0, 2, 1, 3}).value().clone().reshape(Shape(with(c.lead, {S, H, D})));
}

// q, k, v packed as one projection's rows [..., S, (Hq + 2·Hkv)·D]: by blocks (all q heads, all k, all v) or by kv
// groups (each group's q heads, its k head, its v head).
template <class T> Tensor<T> packed(const Case& c, const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v) {
  const std::int64_t B = q.dim(0), S = c.Sq, D = c.D, heads = c.Hq + 2 * c.Hkv, G = c.Hq / c.Hkv;
  Tensor<T> out(Shape(with(c.lead, {S, heads * D})));
  // Slot `at` of a row: which tensor and which of its heads.
  const auto source = [&](std::int64_t at) -> std::pair<const Tensor<T>*, std::int64_t> {
    if (c.options.packing == nn::QkvPacking::blocks) {
      if (at < c.Hq) return {&q, at};
      return at < c.Hq + c.Hkv ? std::pair{&k, at - c.Hq} : std::pair{&v, at - c.Hq - c.Hkv};
    }
    const std::int64_t group = at / (G + 2), within = at % (G + 2);
    if (within < G) return {&q, group * G + within};
    return within == G ? std::pair{&k, group} : std::pair{&v, group};
  };
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t s = 0; s < S; ++s) {
      T* row = out.data() + (b * S + s) * heads * D;
      for (std::int64_t at = 0; at < heads; ++at) {
        const auto [src, head] = source(at);
        for (std::int64_t d = 0; d < D; ++d) row[at * D + d] = (*src)(b, head, s, d);
      }
    }
  }
  return out;
}

// The call's inputs in the case's form: q, k, v (or qkv), then the bias.
template <class T> std::vector<Tensor<T>> call_inputs(const Case& c, const Operands& x) {
  const Tensor<T> q = cast<T>(x.q), k = cast<T>(x.k), v = cast<T>(x.v);
  std::vector<Tensor<T>> in;
  if (c.packed) {
    in = {packed(c, q, k, v)};
  } else {
    in = {arranged(c, q), arranged(c, k), arranged(c, v)};
  }
  if (x.bias.defined()) in.push_back(cast<T>(x.bias));
  return in;
}

template <class T> Var<T> attend(const Case& c, const std::vector<Var<T>>& in) {
  const bool biased = !c.bias_shape.empty();
  if (c.packed) return nn::dot_product_attention_qkv(in[0], c.Hq, c.Hkv, c.options, biased ? in[1] : Var<T>());
  return nn::dot_product_attention(in[0], in[1], in[2], c.options, biased ? in[3] : Var<T>());
}

// The output in canonical [B, Hq, Sq, Dv].
Tensor<double> canonical(const Case& c, const Tensor<double>& o) {
  const std::int64_t B = batch_of(c);
  if (!c.packed && c.options.layout == nn::AttentionLayout::bhsd) return o.reshape({B, c.Hq, c.Sq, c.Dv});
  return permute(constant(o.reshape({B, c.Sq, c.Hq, c.Dv})), {0, 2, 1, 3}).value().clone();
}

// Whether query i of batch b sees key j, from the options as documented.
bool sees(const Case& c, std::int64_t b, std::int64_t i, std::int64_t j) {
  const nn::AttentionOptions& o = c.options;
  const std::int64_t queries = o.q_lengths.empty() ? c.Sq : o.q_lengths[b];
  const std::int64_t keys = o.kv_lengths.empty() ? c.Sk : o.kv_lengths[b];
  const std::int64_t diagonal = o.bottom_right ? i + keys - queries : i;
  return i < queries && j < keys && (!o.causal || j <= diagonal) &&
         (o.window_right < 0 || j <= diagonal + o.window_right) && (o.window_left < 0 || j >= diagonal - o.window_left);
}

// softmax(scale·q·kᵀ + bias, over the keys a query sees)·v with dropout, in double loops: [B, Hq, Sq, Dv].
Tensor<double> reference(const Case& c, const Operands& x) {
  const std::int64_t B = batch_of(c), G = c.Hq / c.Hkv;
  const double scale = c.options.scale.value_or(1.0 / std::sqrt(static_cast<double>(c.D)));
  const double p = c.options.dropout;
  const Tensor<float> draws =
      rand_uniform<float>({B, c.Hq, c.Sq, c.Sk}, c.options.dropout_seed);  // dropout's numbers, as documented
  Tensor<double> bias({B, c.Hq, c.Sq, c.Sk});
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < c.Hq; ++h) {
      for (std::int64_t i = 0; i < c.Sq; ++i) {
        for (std::int64_t j = 0; j < c.Sk; ++j) {
          double value = 0;
          if (c.bias_shape.size() == 2) value = x.bias(i, j);
          if (c.bias_shape.size() == 4) value = x.bias(c.bias_shape[0] == 1 ? 0 : b, c.bias_shape[1] == 1 ? 0 : h, i, j);
          bias(b, h, i, j) = value;
        }
      }
    }
  }
  Tensor<double> out = zeros<double>({B, c.Hq, c.Sq, c.Dv});
  std::vector<double> s(static_cast<std::size_t>(c.Sk));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < c.Hq; ++h) {
      for (std::int64_t i = 0; i < c.Sq; ++i) {
        double max = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < c.Sk; ++j) {
          if (!sees(c, b, i, j)) continue;
          double dot = 0;
          for (std::int64_t d = 0; d < c.D; ++d) dot += x.q(b, h, i, d) * x.k(b, h / G, j, d);
          s[j] = scale * dot + bias(b, h, i, j);
          max = std::max(max, s[j]);
        }
        double total = 0;
        for (std::int64_t j = 0; j < c.Sk; ++j) total += sees(c, b, i, j) ? std::exp(s[j] - max) : 0.0;
        for (std::int64_t j = 0; j < c.Sk; ++j) {
          if (!sees(c, b, i, j) || draws(b, h, i, j) < p) continue;
          const double weight = std::exp(s[j] - max) / total / (1 - p);
          for (std::int64_t d = 0; d < c.Dv; ++d) out(b, h, i, d) += weight * x.v(b, h / G, j, d);
        }
      }
    }
  }
  return out;
}

std::vector<Case> option_cases() {
  using nn::AttentionLayout;
  std::vector<Case> cases{
      {"plain", {2}, 2, 2, 7, 7, 5, 5},
      {"rank 2: one head", {}, 1, 1, 6, 9, 4, 3},
      {"Dv differs from D, several batch axes", {2, 2}, 2, 2, 5, 6, 4, 7},
      {"causal", {2}, 2, 2, 9, 9, 4, 4, {.causal = true}},
      {"causal, fewer queries than keys (bottom-right)", {2}, 2, 2, 5, 9, 4, 4, {.causal = true}},
      {"causal, more queries than keys: rows that see no key", {1}, 2, 2, 9, 5, 4, 4, {.causal = true}},
      {"causal top-left, more queries than keys", {1}, 2, 2, 9, 5, 4, 4, {.causal = true, .bottom_right = false}},
      {"grouped-query 4:2, causal, bshd", {2}, 4, 2, 7, 7, 4, 4,
       {.causal = true, .layout = AttentionLayout::bshd}},
      {"multi-query 3:1", {2}, 3, 1, 6, 8, 4, 5},
      {"sliding window (2, 0)", {1}, 2, 2, 11, 11, 4, 4, {.window_left = 2, .window_right = 0}},
      {"sliding window (1, 2) with causal", {1}, 2, 2, 8, 10, 4, 4,
       {.causal = true, .window_left = 1, .window_right = 2}},
      {"key padding", {3}, 2, 2, 7, 8, 4, 4, {.q_lengths = {7, 4, 0}, .kv_lengths = {8, 3, 5}}},
      {"key padding, causal", {2}, 2, 2, 7, 8, 4, 4, {.causal = true, .kv_lengths = {6, 2}}},
      {"bias [Sq, Sk]", {2}, 2, 2, 5, 6, 4, 4, {}, {5, 6}},
      {"bias [B, 1, Sq, Sk], causal", {2}, 2, 2, 6, 6, 4, 4, {.causal = true}, {2, 1, 6, 6}},
      {"bias [1, Hq, Sq, Sk], grouped-query", {2}, 4, 2, 5, 6, 4, 4, {}, {1, 4, 5, 6}},
      {"bias [B, Hq, Sq, Sk]", {2}, 2, 2, 5, 6, 4, 4, {}, {2, 2, 5, 6}},
      {"dropout", {2}, 2, 2, 7, 9, 4, 4, {.dropout = 0.3, .dropout_seed = 11}},
      {"dropout, causal, grouped-query, bshd", {2}, 4, 2, 7, 7, 4, 4,
       {.causal = true, .dropout = 0.25, .dropout_seed = 5, .layout = AttentionLayout::bshd}},
      {"scale", {1}, 2, 2, 5, 5, 4, 4, {.scale = 0.9}},
      {"packed qkv", {2}, 2, 2, 7, 7, 4, 4, {.causal = true}, {}, true},
      {"packed qkv, grouped-query, bias, dropout", {2}, 4, 2, 6, 6, 3, 3,
       {.dropout = 0.2, .dropout_seed = 3}, {1, 4, 6, 6}, true},
      {"packed qkv by kv groups, grouped-query, causal", {2}, 6, 2, 7, 7, 3, 3,
       {.causal = true, .packing = nn::QkvPacking::groups}, {}, true},
      {"blocks of keys and queries: S = 129, causal", {1}, 1, 1, 129, 129, 3, 3, {.causal = true}},
      {"S = 1", {2}, 2, 2, 1, 1, 4, 4, {.causal = true}},
  };
  return cases;
}

// Runs check(case, seed) on every option case with a fresh seed, both reported on failure.
template <class Check> void for_each_case(Check check) {
  for (const Case& c : option_cases()) {
    const std::uint64_t seed = fresh_seed();
    const std::string name = c.name;
    CAPTURE(name);
    CAPTURE(seed);
    check(c, seed);
  }
}

// Random weights of the output's shape, for a scalar loss Σ o·w.
Tensor<double> output_weights(const Case& c, const std::vector<Tensor<double>>& inputs, std::uint64_t seed) {
  std::vector<Var<double>> in(inputs.begin(), inputs.end());
  return randn<double>(attend(c, in).shape(), seed + 9);
}

GradcheckFunction loss_of(const Case& c, const Tensor<double>& weights) {
  return [c, weights](const std::vector<Var<double>>& in) { return sum(attend(c, in) * constant(weights)); };
}

}  // namespace

TEST_CASE("dot_product_attention matches attention written out in double, in every option") {
  for_each_case([](const Case& c, std::uint64_t seed) {
    const Operands x = draw(c, seed);
    std::vector<Var<double>> in;
    for (const Tensor<double>& t : call_inputs<double>(c, x)) in.push_back(constant(t));
    test::check_close(canonical(c, attend(c, in).value()), reference(c, x), {1e-12, 1e-12});
  });
}

TEST_CASE("dot_product_attention's gradients pass gradcheck in double, in every option") {
  for_each_case([](const Case& c, std::uint64_t seed) {
    const std::vector<Tensor<double>> inputs = call_inputs<double>(c, draw(c, seed));
    const GradcheckResult result =
        gradcheck(loss_of(c, output_weights(c, inputs, seed)), inputs, {.fast_mode = true, .projections = 4});
    CHECK_MESSAGE(result.passed, result.report);
  });
}

TEST_CASE("dot_product_attention's recorded backward (create_graph) gives the fused backward's gradients") {
  for_each_case([](const Case& c, std::uint64_t seed) {
    std::vector<Var<double>> in;
    for (const Tensor<double>& t : call_inputs<double>(c, draw(c, seed))) in.push_back(param(t));
    const Var<double> o = attend(c, in);
    const Var<double> loss = sum(o * constant(randn<double>(o.shape(), seed + 9)));
    const std::vector<Var<double>> fused = grad({loss}, in, {.retain_graph = true});
    const std::vector<Var<double>> recorded = grad({loss}, in, {.create_graph = true});
    for (std::size_t k = 0; k < in.size(); ++k) {
      CAPTURE(k);
      CHECK(recorded[k].requires_grad());
      test::check_close(recorded[k].value(), fused[k].value(), {1e-11, 1e-12});
    }
  });
}

TEST_CASE("dot_product_attention is twice differentiable: gradgradcheck in double") {
  for_each_case([](const Case& c, std::uint64_t seed) {
    if (c.Sq > 16) return;  // the composite's second derivative at S = 129 adds time, not coverage
    const std::vector<Tensor<double>> inputs = call_inputs<double>(c, draw(c, seed));
    const GradcheckResult result =
        gradgradcheck(loss_of(c, output_weights(c, inputs, seed)), inputs, {.fast_mode = true, .projections = 3});
    CHECK_MESSAGE(result.passed, result.report);
  });
}

// The gradient penalty |∂L/∂q|² differentiated twice more: the recorded backward node's own recorded backward.
TEST_CASE("dot_product_attention is three times differentiable: gradgradcheck of a gradient penalty in double") {
  for_each_case([](const Case& c, std::uint64_t seed) {
    if (c.Sq > 16) return;
    const std::vector<Tensor<double>> inputs = call_inputs<double>(c, draw(c, seed));
    const GradcheckFunction loss = loss_of(c, output_weights(c, inputs, seed));
    const GradcheckFunction penalty = [loss](const std::vector<Var<double>>& in) {
      const Var<double> g = grad({loss(in)}, {in[0]}, {.create_graph = true})[0];
      return sum(g * g);
    };
    const GradcheckResult result = gradgradcheck(penalty, inputs, {.fast_mode = true, .projections = 2});
    CHECK_MESSAGE(result.passed, result.report);
  });
}

TEST_CASE("a Hessian-vector product through dot_product_attention keeps memory linear in S on the cpu") {
  const std::int64_t S = 2048, D = 16;
  const Var<float> q = param(randn<float>({1, 1, S, D}, 1)), k = param(randn<float>({1, 1, S, D}, 2)),
                   v = param(randn<float>({1, 1, S, D}, 3));
  const Tensor<float> w = randn<float>({1, 1, S, D}, 4), u = randn<float>({1, 1, S, D}, 5);
  reset_host_memory_peak();
  const std::int64_t before = host_memory_stats().in_use_bytes;
  const Var<float> loss = sum(nn::dot_product_attention(q, k, v, {.causal = true}) * constant(w));
  const std::vector<Var<float>> g = grad({loss}, {q, k, v}, {.create_graph = true});
  backward(Var<float>(sum(g[0] * constant(u)) + sum(g[1] * constant(u)) + sum(g[2] * constant(u))));
  const std::int64_t extra = host_memory_stats().peak_in_use_bytes - before;
  // The output, the gradients, their cotangents and the second-order gradients: a few dozen S·D floats. One S × S
  // matrix of floats would be 16 MiB.
  CHECK(extra <= 64 * S * D * static_cast<std::int64_t>(sizeof(float)));
  CHECK(q.grad().defined());
}

// Low precision against the double path on the same rounded inputs: the output and the gradients are each rounded
// to T once from f32 sums, so an element is off by half a T ulp of itself plus the f32 sums' error (outputs: 1e-5;
// gradients, which sum over heads, queries and keys: 2^-16 of the tensor's largest element, plus 4 T ulps of it for
// the rounded dO and the rounded partial products the two passes share).
TEST_CASE_TEMPLATE("dot_product_attention in bf16, f16 and f32 matches double on the same inputs", T, bf16, f16,
                   float) {
  const double unit = std::is_same_v<T, bf16> ? 0x1p-8 : std::is_same_v<T, f16> ? 0x1p-11 : 0x1p-23;
  const std::vector<Case> cases{
      {"odd head dims: D = 40, S = 129, causal", {1}, 2, 2, 129, 129, 40, 40, {.causal = true}},
      {"D = 72, grouped-query, bias, dropout", {2}, 4, 2, 33, 70, 72, 72, {.dropout = 0.1, .dropout_seed = 2},
       {1, 4, 33, 70}},
      {"D = 100, packed, window", {1}, 2, 1, 65, 65, 100, 100, {.window_left = 16, .window_right = 0}, {}, true},
  };
  for (const Case& c : cases) {
    const std::uint64_t seed = fresh_seed();
    const std::string name = c.name;
    CAPTURE(name);
    CAPTURE(seed);
    const std::vector<Tensor<T>> inputs = call_inputs<T>(c, draw(c, seed));
    std::vector<Var<T>> low;
    std::vector<Var<double>> high;
    for (const Tensor<T>& t : inputs) {
      low.push_back(param(t));
      high.push_back(param(cast<double>(t)));
    }
    const Var<T> o = attend(c, low);
    const Var<double> o_double = attend(c, high);
    test::check_close(o.value(), o_double.value(), {unit, 1e-5});
    const Tensor<double> dy = randn<double>(o.shape(), seed + 9);
    backward(o, cast<T>(dy));
    backward(o_double, cast<double>(cast<T>(dy)));
    for (std::size_t k = 0; k < low.size(); ++k) {
      CAPTURE(k);
      const Tensor<double>& want = high[k].grad();
      double largest = 0;
      for (std::int64_t e = 0; e < want.numel(); ++e) largest = std::max(largest, std::abs(want.flat(e)));
      test::check_close(low[k].grad(), want, {unit, (4 * unit + 0x1p-16) * largest});
    }
  }
}

TEST_CASE("dot_product_attention's memory grows with S, not S squared") {
  const std::int64_t S = 2048, D = 16;
  const Var<float> q = param(randn<float>({1, 1, S, D}, 1)), k = param(randn<float>({1, 1, S, D}, 2)),
                   v = param(randn<float>({1, 1, S, D}, 3));
  reset_host_memory_peak();
  const std::int64_t before = host_memory_stats().in_use_bytes;
  backward(sum(nn::dot_product_attention(q, k, v, {.causal = true})));
  const std::int64_t extra = host_memory_stats().peak_in_use_bytes - before;
  // The output, its gradient, the three gradients and the row statistics: ~6·S·D floats. One S × S matrix of floats
  // would be 16 MiB.
  CHECK(extra <= 16 * S * D * static_cast<std::int64_t>(sizeof(float)));
}

TEST_CASE("dot_product_attention gives the same bits on one thread and on the pool, with dropout and a bias") {
  const Case c{"", {2}, 4, 2, 100, 130, 16, 16, {.causal = true, .dropout = 0.1, .dropout_seed = 4}, {1, 1, 100, 130}};
  const std::vector<Tensor<float>> inputs = call_inputs<float>(c, draw(c, 3));
  const auto run = [&](int threads) {
    const test::ThreadCount scope(threads);
    std::vector<Var<float>> in;
    for (const Tensor<float>& t : inputs) in.push_back(param(t));
    const Var<float> o = attend(c, in);
    backward(sum(o * o));
    std::vector<Tensor<float>> out{o.value()};
    for (const Var<float>& x : in) out.push_back(x.grad());
    return out;
  };
  const std::vector<Tensor<float>> one = run(1), pool = run(2);
  for (std::size_t k = 0; k < one.size(); ++k) CHECK(test::bitwise_equal(one[k], pool[k]));
}

TEST_CASE("dropout keeps about 1 - p of the probabilities, the same ones for a seed") {
  const Var<double> q = constant(randn<double>({1, 1, 64, 8}, 1)), k = constant(randn<double>({1, 1, 256, 8}, 2));
  const Var<double> v = constant(ones<double>({1, 1, 256, 1}));
  // With v all ones, each output is Σ_j kept_j·p_j/(1 - p): 1 on average.
  const Tensor<double> o = nn::dot_product_attention(q, k, v, {.dropout = 0.5, .dropout_seed = 7}).value();
  CHECK(test::moments(o).mean == doctest::Approx(1.0).epsilon(0.1));
  CHECK(test::moments(o).stddev > 0.01);
  CHECK(test::bitwise_equal(o, nn::dot_product_attention(q, k, v, {.dropout = 0.5, .dropout_seed = 7}).value()));
  CHECK_FALSE(test::bitwise_equal(o, nn::dot_product_attention(q, k, v, {.dropout = 0.5, .dropout_seed = 8}).value()));
}

TEST_CASE("dot_product_attention names the op and the shapes or values that do not fit") {
  const auto q = constant(randn<float>({2, 4, 3, 8}, 1)), k = constant(randn<float>({2, 3, 5, 8}, 2)),
             v = constant(randn<float>({2, 3, 5, 8}, 3)), k2 = constant(randn<float>({2, 2, 5, 8}, 4)),
             v2 = constant(randn<float>({2, 2, 5, 8}, 5));
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(q, k, v),
                       "dot_product_attention: the kv heads (3) must divide the q heads (4): q [2, 4, 3, 8], k "
                       "[2, 3, 5, 8]",
                       Error);
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(q, constant(randn<float>({2, 2, 5, 6}, 4)), v2),
                       "dot_product_attention: q [2, 4, 3, 8], k [2, 2, 5, 6] and v [2, 2, 5, 8] should be [..., "
                       "heads, S, D] with one batch, k and v the same heads and length, q and k the same D > 0",
                       Error);
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(q, k2, v2, {}, constant(randn<float>({5, 3}, 6))),
                       "dot_product_attention: bias [5, 3] should be [3, 5] or [2 or 1, 4 or 1, 3, 5]", Error);
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(q, k2, v2, {.kv_lengths = {5, 6}}),
                       "dot_product_attention: kv_lengths[1] = 6 is outside [0, 5]", Error);
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(q, k2, v2, {.q_lengths = {1}}),
                       "dot_product_attention: q_lengths has 1 entries but the batch has 2", Error);
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(q, k2, v2, {.dropout = 1.0}),
                       "dot_product_attention: dropout must be in [0, 1), got 1", Error);
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(q, k2, v2, {.window_left = -2}),
                       "dot_product_attention: a window side must be >= 0 or -1 (open), got -2 and -1", Error);
  // Read as [B, S, heads, D], the same tensors have 3 q heads and 5 kv heads.
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(q, k2, v2, {.layout = nn::AttentionLayout::bshd}),
                       "dot_product_attention: the kv heads (5) must divide the q heads (3): q [2, 4, 3, 8], k "
                       "[2, 2, 5, 8]",
                       Error);
  CHECK_THROWS_WITH_AS(nn::dot_product_attention_qkv(constant(randn<float>({2, 5, 30}, 7)), 4, 2),
                       "dot_product_attention: qkv [2, 5, 30] should be [..., S, (q_heads + 2·kv_heads)·D] with 4 q "
                       "heads and 2 kv heads: 30 is not a positive multiple of 8",
                       Error);
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(q, k2, v2, {.scale = std::numeric_limits<double>::infinity()}),
                       "dot_product_attention: the scale must be finite, got inf", Error);
}

TEST_CASE("dot_product_attention_kernels names the cpu's kernels there, and checks the call as the op does") {
  const auto q = constant(randn<bf16>({2, 4, 3, 8}, 1)), k = constant(randn<bf16>({2, 2, 5, 8}, 2));
  const nn::AttentionKernels kernels = nn::dot_product_attention_kernels(q, k, k, {.causal = true});
  CHECK(kernels.forward == "cpu");
  CHECK(kernels.backward == "cpu");
  CHECK(nn::dot_product_attention_qkv_kernels(constant(randn<bf16>({2, 5, 32}, 3)), 2, 1).forward == "cpu");
  CHECK_THROWS_WITH_AS(nn::dot_product_attention_kernels(q, k, k, {.kv_lengths = {5, 6}}),
                       "dot_product_attention: kv_lengths[1] = 6 is outside [0, 5]", Error);
}

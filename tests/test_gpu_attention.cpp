// dot_product_attention (cuda/attention.cu) and rope (cuda/rope.cu) on the GPU against the cpu in double
// (tests/gpu_reference.hpp), forward and every gradient: every option, odd lengths and head sizes, the masks, the
// bias and dropout's draws the same on both devices; memory linear in S, the same bits run after run, and the
// errors the GPU path adds.
#include <doctest/doctest.h>

#include <string>
#include <type_traits>
#include <vector>

#include "gpu_reference.hpp"
#include "tapegrad/cuda/cudnn_attention.hpp"
#include "tapegrad/gpu.hpp"

using namespace tapegrad;
using test::check_against_cpu;
using test::Tolerance;

// The kernels sum in f32 (f64 for f64) in another order than the cpu and round each result once; rope rounds each
// output once from f32 products: within the tolerance of a chain of ops.
template <class T> constexpr Tolerance tolerance = test::chain_tolerance<T>;

// 7 queries and keys, not a multiple of 8; grouped-query heads, a broadcast bias (its gradient summed over the
// batches and heads it serves), key padding, a window, dropout.
TEST_CASE_TEMPLATE("dot_product_attention's options on the GPU match the cpu in double", T, TAPEGRAD_GPU_DTYPES) {
  using nn::AttentionLayout;
  const std::vector<nn::AttentionOptions> cases{
      {.layout = AttentionLayout::bshd},
      {.causal = true, .layout = AttentionLayout::bshd},
      {.causal = true, .window_left = 2, .kv_lengths = {7, 4}, .dropout = 0.2, .dropout_seed = 3,
       .layout = AttentionLayout::bshd},
  };
  for (std::size_t c = 0; c < cases.size(); ++c) {
    CAPTURE(c);
    check_against_cpu<T>(
        "dot_product_attention",
        [&](const auto& v) { return nn::dot_product_attention(v[0], v[1], v[2], cases[c], v[3]); },
        {{{2, 7, 4, 16}}, {{2, 7, 2, 16}}, {{2, 7, 2, 5}}, {{1, 4, 7, 7}}}, tolerance<T>, 3);
  }
}

TEST_CASE_TEMPLATE("dot_product_attention_qkv on the GPU matches the cpu in double, packed by blocks or groups", T,
                   TAPEGRAD_GPU_DTYPES) {
  for (const nn::QkvPacking packing : {nn::QkvPacking::blocks, nn::QkvPacking::groups}) {
    CAPTURE(int(packing));
    check_against_cpu<T>(
        "dot_product_attention_qkv",
        [&](const auto& v) { return nn::dot_product_attention_qkv(v[0], 4, 2, {.causal = true, .packing = packing}); },
        {{{2, 9, 8 * 12}}}, tolerance<T>, 4);
  }
}

struct Case {
  Shape q, k, v, bias;  // bias: rank 0 for none
  nn::AttentionOptions options;
};

// Lengths S = 1, 7, 129, 1000 and head sizes 40, 72, 100 (padded to 16 in the kernels' tiles), tiles of queries and
// keys cut short, rows that see no key, top-left causal, a full bias, per-batch query and key lengths, bhsd.
TEST_CASE_TEMPLATE("dot_product_attention's fused kernels at odd lengths and head sizes match the cpu", T,
                   TAPEGRAD_GPU_DTYPES) {
  using nn::AttentionLayout;
  const std::vector<Case> cases{
      {{2, 2, 1, 40}, {2, 2, 1, 40}, {2, 2, 1, 40}, {}, {.causal = true}},
      {{1, 4, 129, 72}, {1, 2, 129, 72}, {1, 2, 129, 100}, {}, {.causal = true}},
      {{1, 2, 70, 100}, {1, 2, 33, 100}, {1, 2, 33, 40}, {1, 2, 70, 33}, {.causal = true}},
      {{1, 2, 70, 40}, {1, 2, 33, 40}, {1, 2, 33, 40}, {}, {.causal = true, .bottom_right = false}},
      {{2, 1, 97, 64}, {2, 1, 130, 64}, {2, 1, 130, 64}, {},
       {.q_lengths = {97, 50}, .kv_lengths = {3, 130}, .dropout = 0.25, .dropout_seed = 8}},
      {{1, 1000, 2, 72}, {1, 1000, 2, 72}, {1, 1000, 2, 72}, {},
       {.causal = true, .window_left = 100, .layout = AttentionLayout::bshd}},
  };
  for (std::size_t c = 0; c < cases.size(); ++c) {
    CAPTURE(c);
    const Case& k = cases[c];
    std::vector<test::GpuInput> inputs{{k.q}, {k.k}, {k.v}};
    if (k.bias.rank() > 0) inputs.push_back({k.bias});
    check_against_cpu<T>(
        "dot_product_attention",
        [&](const auto& v) {
          using V = std::remove_cvref_t<decltype(v[0])>;
          return nn::dot_product_attention(v[0], v[1], v[2], k.options, v.size() > 3 ? v[3] : V());
        },
        inputs, tolerance<T>, 10 + c);
  }
}

// Whether cuDNN's fused attention runs here; says why not otherwise (the tests that need it pass without it).
bool cudnn_runs_here() {
  const Var<bf16> x = constant(randn<bf16>({1, 1, 16, 64}, 1, 0.0, 1.0, test::gpu));
  const nn::AttentionKernels kernels = nn::dot_product_attention_kernels(x, x, x);
  if (kernels.forward != "cudnn") MESSAGE("cuDNN does not run here: ", kernels.forward);
  return kernels.forward == "cudnn";
}

// cuDNN's backward, or tapegrad's where the loaded cuDNN's backward has a known bug for the call's lengths.
bool cudnn_backward(const std::string& kernels) {
  return kernels == "cudnn" || kernels.find("9.15.0 and older") != std::string::npos;
}

// The problems of causal language models, on cuDNN in bf16 and f16 (each call reports the kernels it runs): both
// layouts, grouped-query heads, causal masks of both alignments with Sq ≠ Sk, sliding windows (one side or both,
// either alignment), per-batch lengths (padding, with the masks per batch element), head sizes 64, 128 and 256,
// lengths that are not multiples of a tile. f32 and f64 say why they stay on tapegrad's kernels.
TEST_CASE_TEMPLATE("dot_product_attention on cuDNN matches the cpu in double where cuDNN takes the call", T,
                   TAPEGRAD_GPU_DTYPES) {
  using nn::AttentionLayout;
  constexpr bool low_precision = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;
  if (!cudnn_runs_here()) return;
  const std::vector<Case> cases{
      {{2, 4, 129, 64}, {2, 4, 129, 64}, {2, 4, 129, 64}, {}, {}},
      {{1, 1000, 4, 128}, {1, 1000, 2, 128}, {1, 1000, 2, 128}, {}, {.causal = true, .layout = AttentionLayout::bshd}},
      {{1, 2, 70, 64}, {1, 2, 200, 64}, {1, 2, 200, 64}, {}, {.causal = true}},
      {{1, 2, 200, 64}, {1, 2, 70, 64}, {1, 2, 70, 64}, {}, {.causal = true, .bottom_right = false}},
      {{1, 2, 96, 256}, {1, 2, 96, 256}, {1, 2, 96, 256}, {}, {.causal = true}},
      {{1, 300, 2, 64}, {1, 300, 2, 64}, {1, 300, 2, 64}, {},
       {.causal = true, .window_left = 50, .layout = AttentionLayout::bshd}},
      {{1, 2, 100, 64}, {1, 2, 300, 64}, {1, 2, 300, 64}, {}, {.window_left = 20, .window_right = 10}},
      {{1, 2, 100, 64}, {1, 2, 130, 64}, {1, 2, 130, 64}, {},
       {.bottom_right = false, .window_left = 40, .window_right = 0}},
      {{2, 4, 129, 64}, {2, 4, 129, 64}, {2, 4, 129, 64}, {}, {.q_lengths = {129, 70}, .kv_lengths = {129, 30}}},
      {{2, 200, 4, 64}, {2, 200, 2, 64}, {2, 200, 2, 64}, {},
       {.causal = true, .q_lengths = {200, 77}, .kv_lengths = {200, 77}, .layout = AttentionLayout::bshd}},
      {{2, 2, 64, 64}, {2, 2, 256, 64}, {2, 2, 256, 64}, {},
       {.causal = true, .window_left = 30, .q_lengths = {64, 10}, .kv_lengths = {256, 100}}},
  };
  for (std::size_t c = 0; c < cases.size(); ++c) {
    CAPTURE(c);
    const Case& k = cases[c];
    const auto operand = [&](const Shape& shape) { return constant(zeros<T>(shape, test::gpu)); };
    const nn::AttentionKernels kernels =
        nn::dot_product_attention_kernels(operand(k.q), operand(k.k), operand(k.v), k.options);
    if constexpr (low_precision) {
      CHECK(kernels.forward == "cudnn");
      CHECK(cudnn_backward(kernels.backward));
    } else {
      CHECK(kernels.forward == "tapegrad: dtype " + std::string(dtype_name(dtype_v<T>)));
    }
    check_against_cpu<T>(
        "dot_product_attention",
        [&](const auto& v) { return nn::dot_product_attention(v[0], v[1], v[2], k.options); },
        {{k.q}, {k.k}, {k.v}}, tolerance<T>, 30 + c);
  }
}

// A fused projection on cuDNN: packed by blocks (read in place) or by kv groups (q's heads gathered into a copy, its
// gradient scattered back).
TEST_CASE_TEMPLATE("dot_product_attention_qkv on cuDNN matches the cpu in double, packed by blocks or groups", T,
                   TAPEGRAD_GPU_DTYPES) {
  if (!cudnn_runs_here()) return;
  for (const nn::QkvPacking packing : {nn::QkvPacking::blocks, nn::QkvPacking::groups}) {
    CAPTURE(int(packing));
    const nn::AttentionOptions options{.causal = true, .packing = packing};
    const nn::AttentionKernels kernels =
        nn::dot_product_attention_qkv_kernels(constant(zeros<T>({2, 65, 8 * 64}, test::gpu)), 4, 2, options);
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) CHECK(cudnn_backward(kernels.backward));
    check_against_cpu<T>(
        "dot_product_attention_qkv",
        [&](const auto& v) { return nn::dot_product_attention_qkv(v[0], 4, 2, options); }, {{{2, 65, 8 * 64}}},
        tolerance<T>, 6);
  }
}

TEST_CASE("dot_product_attention on cuDNN: deterministic gives the same bits run after run; calls it does not take "
          "say why") {
  if (!cudnn_runs_here()) return;
  const Device gpu = test::gpu;
  const Var<bf16> q = param(randn<bf16>({2, 8, 1024, 128}, 1, 0.0, 1.0, gpu)),
                  k = param(randn<bf16>({2, 2, 1024, 128}, 2, 0.0, 1.0, gpu)),
                  v = param(randn<bf16>({2, 2, 1024, 128}, 3, 0.0, 1.0, gpu));
  const Tensor<bf16> dy = randn<bf16>({2, 8, 1024, 128}, 4, 0.0, 1.0, gpu);
  const nn::AttentionOptions options{.causal = true, .deterministic = true};
  CHECK(nn::dot_product_attention_kernels(q, k, v, options).backward == "cudnn");
  const auto gradients = [&] {
    backward(nn::dot_product_attention(q, k, v, options), dy);
    std::vector<Tensor<bf16>> out;
    for (Var<bf16> x : {q, k, v}) {
      out.push_back(x.grad().to(Device::cpu()));
      x.zero_grad();
    }
    return out;
  };
  const std::vector<Tensor<bf16>> first = gradients(), second = gradients();
  for (std::size_t i = 0; i < first.size(); ++i) CHECK(test::bitwise_equal(first[i], second[i]));

  CHECK(nn::dot_product_attention_kernels(q, k, v, {.dropout = 0.1}).forward ==
        "tapegrad: dropout (cuDNN draws its own numbers)");
  CHECK(nn::dot_product_attention_kernels(q, k, v, {.kv_lengths = {0, 7}}).forward == "tapegrad: a query that sees no key");
  cuda::set_attention_kernels(cuda::AttentionKernels::tapegrad);
  CHECK(nn::dot_product_attention_kernels(q, k, v).forward == "tapegrad: chosen by set_attention_kernels");
  cuda::set_attention_kernels(cuda::AttentionKernels::cudnn_where_it_applies);
}

// Turns set_attention_autotune on for a scope and back as it was, also when a check throws.
class AttentionAutotune {
 public:
  AttentionAutotune() : previous_(cuda::attention_autotune()) { cuda::set_attention_autotune(true); }
  ~AttentionAutotune() { cuda::set_attention_autotune(previous_); }
  AttentionAutotune(const AttentionAutotune&) = delete;
  AttentionAutotune& operator=(const AttentionAutotune&) = delete;

 private:
  bool previous_;
};

// set_attention_autotune: a problem first seen while it is on runs several of cuDNN's plans on its first call and
// keeps the fastest. Problems no other case runs (their plans made while autotune is on), with key counts that are
// multiples of 128 (so that every cuDNN version takes the backward) and grouped-query heads: the first call (the
// tuning one) matches the CPU and chose among several plans; a later call times nothing and gives the same bits (the
// gradients too where the backward is deterministic).
TEST_CASE_TEMPLATE("dot_product_attention on cuDNN with its plans timed matches the cpu in double", T,
                   TAPEGRAD_GPU_DTYPES) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
    if (!cudnn_runs_here()) return;
    const AttentionAutotune autotune;
    for (const bool deterministic : {true, false}) {
      CAPTURE(deterministic);
      const std::int64_t S = deterministic ? 384 : 256;
      const std::vector<test::GpuInput> inputs{{{2, 4, S, 64}}, {{2, 2, S, 64}}, {{2, 2, S, 64}}};
      const nn::AttentionOptions options{.causal = true, .deterministic = deterministic};
      const auto attention = [&](const auto& v) { return nn::dot_product_attention(v[0], v[1], v[2], options); };
      const auto operand = [&](const Shape& shape) { return constant(zeros<T>(shape, test::gpu)); };
      const nn::AttentionKernels kernels = nn::dot_product_attention_kernels(
          operand(inputs[0].shape), operand(inputs[1].shape), operand(inputs[2].shape), options);  // makes the plans
      CHECK(kernels.forward == "cudnn");
      CHECK(kernels.backward == "cudnn");

      const auto seed = static_cast<std::uint64_t>(40 + S);
      std::vector<Tensor<T>> values;
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        values.push_back(test::draw_input<T>(inputs[k], seed + 101 * k));
      }
      const std::int64_t before = cuda::cudnn_attention_candidates_timed();
      const test::Run<T> first =
          test::check_values_against_cpu<T>("dot_product_attention", attention, inputs, values, tolerance<T>, seed);
      const std::int64_t timed = cuda::cudnn_attention_candidates_timed() - before;
      MESSAGE(timed, " of cuDNN's plans timed, forward and backward");
      CHECK(timed >= 2);  // (one plan alone is not timed)
      const test::Run<T> later = test::run_op<T, T>(attention, inputs, values, nullptr, test::gpu, seed + 7777);
      CHECK(cuda::cudnn_attention_candidates_timed() - before == timed);
      CHECK(test::bitwise_equal(first.y, later.y));
      for (std::size_t k = 0; k < inputs.size() && deterministic; ++k) {
        CAPTURE(k);
        CHECK(test::bitwise_equal(first.grads[k], later.grads[k]));
      }
    }
  }
}

TEST_CASE("dot_product_attention on cuDNN: memory linear in S") {
  if (!cudnn_runs_here()) return;
  const Device gpu = test::gpu;
  const std::int64_t S = 8192, D = 64;
  const Var<bf16> q = param(randn<bf16>({1, 2, S, D}, 1, 0.0, 1.0, gpu));
  const Tensor<bf16> dy = randn<bf16>({1, 2, S, D}, 4, 0.0, 1.0, gpu);
  backward(nn::dot_product_attention(q, q, q, {.causal = true}), dy);  // compiles the plans
  cuda::synchronize(0);
  cuda::reset_peak_memory(0);
  const std::size_t before = cuda::memory_stats(0).in_use;
  backward(nn::dot_product_attention(q, q, q, {.causal = true}), dy);
  cuda::synchronize(0);
  // O, the gradients, the row statistics and dq's f32 sum: a few S·D; one S × S matrix of f32 would be 256 MiB.
  CHECK(cuda::memory_stats(0).peak_in_use - before < std::size_t{16} * S * D * 2 * sizeof(float));
}

TEST_CASE("dot_product_attention on the GPU: the same bits run after run, memory linear in S") {
  const Device gpu = test::gpu;
  const std::int64_t S = 4096, D = 64;
  const Var<bf16> q = param(randn<bf16>({1, 2, S, D}, 1, 0.0, 1.0, gpu)),
                  k = param(randn<bf16>({1, 2, S, D}, 2, 0.0, 1.0, gpu)),
                  v = param(randn<bf16>({1, 2, S, D}, 3, 0.0, 1.0, gpu));
  const Tensor<bf16> dy = randn<bf16>({1, 2, S, D}, 4, 0.0, 1.0, gpu);
  const auto run = [&] {
    const Var<bf16> o = nn::dot_product_attention(q, k, v, {.causal = true, .dropout = 0.1, .dropout_seed = 5});
    backward(o, dy);
    std::vector<Tensor<bf16>> out{o.value().to(Device::cpu())};
    for (Var<bf16> x : {q, k, v}) {
      out.push_back(x.grad().to(Device::cpu()));
      x.zero_grad();
    }
    return out;
  };
  const std::vector<Tensor<bf16>> first = run();
  cuda::reset_peak_memory(0);
  const std::size_t before = cuda::memory_stats(0).in_use;
  const std::vector<Tensor<bf16>> second = run();
  for (std::size_t i = 0; i < first.size(); ++i) CHECK(test::bitwise_equal(first[i], second[i]));
  // O, its gradient, three gradients and the row statistics: a few S·D; one S × S matrix of f32 would be 128 MiB.
  CHECK(cuda::memory_stats(0).peak_in_use - before < std::size_t{16} * S * D * 2 * sizeof(float));
}

TEST_CASE("dot_product_attention on the GPU names a head size its kernels do not take") {
  const Var<float> x = constant(randn<float>({1, 1, 4, 300}, 1, 0.0, 1.0, test::gpu));
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(x, x, x),
                       doctest::Contains("dot_product_attention: head sizes 300 (q, k) and 300 (v) exceed the GPU "
                                         "kernels' 256"),
                       Error);
}

// Rows of odd head size and a partial rotary dimension, heads left unturned, both pairings and layouts.
TEST_CASE_TEMPLATE("rope on the GPU matches the cpu in double", T, TAPEGRAD_GPU_DTYPES) {
  const std::vector<nn::RopeOptions> cases{
      {},
      {.interleaved = true, .position_offset = 40},
      {.rotary_dim = 6, .rotated_heads = 2},
      {.rotary_dim = 4, .layout = nn::AttentionLayout::bhsd},
  };
  for (std::size_t c = 0; c < cases.size(); ++c) {
    CAPTURE(c);
    const Shape shape = c == 2 ? Shape{2, 33, 3, 9} : Shape{2, 33, 3, 10};
    check_against_cpu<T>("rope", [&](const auto& v) { return nn::rope(v[0], cases[c]); }, {{shape}}, tolerance<T>,
                         5);
  }
}

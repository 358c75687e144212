// layernorm_mlp on the GPU against the CPU in double (tests/gpu_reference.hpp), forward and every gradient: every
// activation × {layernorm, rmsnorm} × biases on and off × every recompute policy, with the norm output returned
// and zero-centered gamma, hidden sizes 24 and 13, ffn sizes 40 and 37 (16-byte packs or single elements), leading
// dims [5] and [2, 3], one row and none, and a larger block (many chunks of rows and tiles of columns); mixed
// precision (f32 parameters, x in T); bitwise identical gradients on every run and under every recompute policy;
// errors.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gpu_reference.hpp"

using namespace tapegrad;
using test::GpuInput;
using test::Tolerance;

namespace {

constexpr Activation all_activations[] = {
    Activation::relu,  Activation::gelu,  Activation::silu,   Activation::quick_gelu, Activation::squared_relu,
    Activation::reglu, Activation::geglu, Activation::swiglu, Activation::glu,        Activation::qgeglu,
    Activation::sreglu, Activation::clamped_swiglu,
};
constexpr Recompute all_policies[] = {Recompute::save_all, Recompute::recompute_norm, Recompute::recompute_all};
struct Case {
  LayerNormMLPOptions options;
  bool biases = true;
  Shape x;  // [..., H]
  std::int64_t ffn = 40;
  bool has_beta() const { return options.norm == NormType::layernorm && biases; }
};

LayerNormMLPOptions options_for(Activation act, NormType norm, Recompute recompute, bool return_h, bool zero_centered) {
  // A limit of 1 makes clamped_swiglu's clamps bite for z of unit size (its default of 7 never would here).
  return {.norm = norm,
          .zero_centered_gamma = zero_centered,
          .epsilon = 1e-5,
          .activation = act,
          .clamped_swiglu = {.limit = 1.0, .alpha = 1.702},
          .return_layernorm_output = return_h,
          .recompute = recompute};
}

std::string describe(const Case& c) {
  const auto& o = c.options;
  return std::string(activation_name(o.activation)) + (o.norm == NormType::rmsnorm ? " rmsnorm" : " layernorm") +
         (c.biases ? " with biases" : " without biases") + " " + std::string(recompute_name(o.recompute)) +
         (o.return_layernorm_output ? " returning h" : "") + (o.zero_centered_gamma ? " zero-centered" : "") +
         (o.residual ? " residual" : "") +
         " x " + c.x.str() + " ffn " + std::to_string(c.ffn);
}

// The node's inputs in order: x, gamma, [beta], w1, [b1], w2, [b2]; each [stddev] scales a unit normal draw so that
// z and y stay of unit size (weights by 1/sqrt(fan-in), as an initializer would).
struct InputPlan {
  std::vector<GpuInput> inputs;
  std::vector<double> mean, stddev;
};
InputPlan plan(const Case& c) {
  const std::int64_t H = c.x.dim(-1), n = activation_width(c.options.activation);
  InputPlan p;
  auto add = [&](Shape shape, double mean, double stddev) {
    p.inputs.push_back({shape});
    p.mean.push_back(mean);
    p.stddev.push_back(stddev);
  };
  add(c.x, 0.5, 2.0);
  add({H}, c.options.zero_centered_gamma ? 0.0 : 1.0, 0.3);
  if (c.has_beta()) add({H}, 0.0, 0.3);
  add({H, n, c.ffn}, 0.0, 1.0 / std::sqrt(double(H)));
  if (c.biases) add({n, c.ffn}, 0.0, 0.3);
  add({c.ffn, H}, 0.0, 1.0 / std::sqrt(double(c.ffn)));
  if (c.biases) add({H}, 0.0, 0.3);
  return p;
}

// The block on the inputs in plan order; with return_layernorm_output y and h side by side, [..., 2H].
template <class T, class P> Var<T> block(const Case& c, const Var<T>& x, const std::vector<Var<P>>& params) {
  std::size_t k = 0;
  const Var<P> gamma = params[k++];
  const Var<P> beta = c.has_beta() ? params[k++] : Var<P>();
  const Var<P> w1 = params[k++];
  const Var<P> b1 = c.biases ? params[k++] : Var<P>();
  const Var<P> w2 = params[k++];
  const Var<P> b2 = c.biases ? params[k++] : Var<P>();
  const auto out = layernorm_mlp(x, gamma, beta, {w1, w2}, {b1, b2}, c.options);
  return c.options.return_layernorm_output ? concat<T>({out.y, out.layernorm_output}, -1) : out.y;
}
template <class U> Var<U> block_of_inputs(const Case& c, const std::vector<Var<U>>& v) {
  return block<U, U>(c, v[0], std::vector<Var<U>>(v.begin() + 1, v.end()));
}

// How close (in double) a pre-activation z may come to a kink of the activation's derivative (relu's 0, the clamps'
// ±limit): T's rounding of h moves z by ~2e-3 in bf16, and on the other side of a kink the derivative jumps by the
// whole slope. Squared relu's derivative has no jump.
template <class T> constexpr double kink_margin = 0.0;
template <> constexpr double kink_margin<bf16> = 1e-2;
template <> constexpr double kink_margin<f16> = 3e-3;

// The smallest distance of z = norm(x)·W1 + b1 (in double, on the CPU) from a kink of the activation.
double distance_to_kinks(const Case& c, const std::vector<Tensor<double>>& v) {
  const auto& o = c.options;
  const bool relu_kink = o.activation == Activation::relu || o.activation == Activation::reglu;
  if (!relu_kink && o.activation != Activation::clamped_swiglu) return INFINITY;
  std::size_t k = 0;
  const Var<double> x = constant(v[k++]), gamma = constant(v[k++]);
  const NormOptions norm_options{.epsilon = o.epsilon, .zero_centered_gamma = o.zero_centered_gamma};
  const Var<double> h = o.norm == NormType::rmsnorm ? rmsnorm(x, gamma, norm_options)
                        : c.has_beta()            ? layernorm(x, gamma, constant(v[k++]), norm_options)
                                                  : layernorm(x, gamma, norm_options);
  const Tensor<double>& w1 = v[k++];
  const Tensor<double>* b1 = c.biases ? &v[k++] : nullptr;
  const std::int64_t H = w1.dim(0), nF = w1.numel() / H, F = w1.dim(2), rows = x.value().numel() / H;
  double closest = INFINITY;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < nF; ++j) {
      double z = b1 ? b1->flat(j) : 0.0;
      for (std::int64_t i = 0; i < H; ++i) z += h.value().flat(r * H + i) * w1.flat(i * nF + j);
      const double limit = o.clamped_swiglu.limit;
      const double d = relu_kink ? (j < F ? std::abs(z) : INFINITY)
                       : j < F   ? std::abs(z - limit)
                                 : std::min(std::abs(z - limit), std::abs(z + limit));
      closest = std::min(closest, d);
    }
  }
  return closest;
}

// Inputs drawn in T as the plan says, redrawn (with the next seeds) until every z keeps T's margin from a kink.
template <class T> std::vector<Tensor<T>> draw(const Case& c, const InputPlan& p, std::uint64_t seed) {
  for (int attempt = 0; attempt < 200; ++attempt, seed += 1000) {
    std::vector<Tensor<T>> values;
    std::vector<Tensor<double>> exact;
    for (std::size_t k = 0; k < p.inputs.size(); ++k) {
      values.push_back(randn<T>(p.inputs[k].shape, seed + k, p.mean[k], p.stddev[k]));
      exact.push_back(cast<double>(values.back()));
    }
    if (kink_margin<T> == 0.0 || distance_to_kinks(c, exact) > kink_margin<T>) return values;
  }
  FAIL("no draw keeps z away from the kinks of ", describe(c));
  return {};
}

// Against the double reference, with z kept off the kinks and values of unit size: f64 differs in summation order
// only; f32 rounds each stage (h, z, a, y; da, dz, dh) once (~6e-8) and sums up to 80 terms per product; bf16 (8
// bits) and f16 (11 bits) carry up to seven chained roundings through the products and the activation's slope (the
// CPU's bf16 measures 6e-3 as a norm, elements a few times that; f16 a quarter of bf16's).
template <class T> constexpr Tolerance tolerance{};
template <> constexpr Tolerance tolerance<double>{1e-9, 1e-9};
template <> constexpr Tolerance tolerance<float>{1e-4, 1e-4};
template <> constexpr Tolerance tolerance<bf16>{5e-2, 5e-2};
template <> constexpr Tolerance tolerance<f16>{1.5e-2, 1.5e-2};

// Squaring activations double the relative rounding of z and grow a's magnitude, and the weight gradients sum
// such products over the rows with cancellation: in bf16 their worst elements measured up to 1.15 × the tolerance
// above on the H200, and 2.2 × on other random draws (sreglu, a W1 element of 0.33 off by 0.15), so they get 3 ×.
template <class T> Tolerance tolerance_for(const Case& c) {
  Tolerance tol = tolerance<T>;
  const Activation a = c.options.activation;
  if (std::is_same_v<T, bf16> && (a == Activation::squared_relu || a == Activation::sreglu)) {
    tol.rtol *= 3;
    tol.atol *= 3;
  }
  return tol;
}

// atol_in_rms: the case's atol counts in units of the reference's rms (test::Tolerance).
template <class T> test::Run<T> check_case(const Case& c, std::uint64_t seed, bool atol_in_rms = false) {
  const std::string what = describe(c);
  CAPTURE(what);
  const InputPlan p = plan(c);
  Tolerance tol = tolerance_for<T>(c);
  tol.atol_in_rms = atol_in_rms;
  return test::check_values_against_cpu<T>(
      what, [&](const auto& v) { return block_of_inputs(c, v); }, p.inputs, draw<T>(c, p, seed), tol, seed);
}

}  // namespace

TEST_CASE_TEMPLATE("layernorm_mlp on the GPU matches the CPU for every activation, norm, bias setting and policy", T,
                   TAPEGRAD_GPU_DTYPES) {
  std::uint64_t seed = 1;
  for (Activation act : all_activations) {
    for (NormType norm : {NormType::layernorm, NormType::rmsnorm}) {
      for (bool biases : {true, false}) {
        for (Recompute recompute : all_policies) {
          // Alternate the hidden size, the leading dims and the options so that each appears with every
          // activation and policy.
          const bool odd = (seed % 2) == 1;
          Case c{.options = options_for(act, norm, recompute, odd, !odd),
                 .biases = biases,
                 .x = odd ? Shape{5, 13} : Shape{2, 3, 24},
                 .ffn = odd ? 37 : 40};
          c.options.residual = seed % 3 == 0;
          check_case<T>(c, seed++);
        }
      }
    }
  }
}

// Many chunks of rows and more than one tile of columns in the activation kernel (its bias gradient adds partial
// sums across chunks), and wider rows for the norm kernels. The weight and bias gradients sum 12288 rows: their
// elements are ~70 in size (√12288 × a's rms for unit dy) and their rounding grows with that: on the H200 bf16 was
// 0.16 off on a dW2 element that cancelled to 0.16, f16 a seventh of that, as the two precisions predict. So atol
// counts in units of the reference's rms.
TEST_CASE_TEMPLATE("layernorm_mlp on the GPU matches the CPU on a larger block", T, TAPEGRAD_GPU_DTYPES) {
  for (Activation act : {Activation::gelu, Activation::swiglu}) {
    const Case c{.options = options_for(act, NormType::layernorm, Recompute::recompute_norm, false, false),
                 .x = Shape{96, 128},
                 .ffn = 2312};
    check_case<T>(c, 250, true);
  }
}

// Rows of 1536: the norm's backward in its block-per-row kernel, which stages dy for db2 and reads it again as the
// residual's gradient (with biases), or stages it for the residual alone (without).
TEST_CASE_TEMPLATE("layernorm_mlp on the GPU with the residual matches the CPU on long rows", T, TAPEGRAD_GPU_DTYPES) {
  for (bool biases : {true, false}) {
    Case c{.options = options_for(Activation::gelu, NormType::layernorm, Recompute::save_all, false, false),
           .biases = biases,
           .x = Shape{48, 1536},
           .ffn = 64};
    c.options.residual = true;
    check_case<T>(c, 260, true);
  }
}

TEST_CASE_TEMPLATE("layernorm_mlp on the GPU takes a single row and no rows", T, TAPEGRAD_GPU_DTYPES) {
  for (const Shape& x : {Shape{1, 13}, Shape{0, 24}, Shape{2, 0, 24}}) {
    for (bool return_h : {false, true}) {
      const Case c{.options = options_for(Activation::swiglu, NormType::layernorm, Recompute::recompute_all, return_h,
                                          false),
                   .x = x};
      const auto run = check_case<T>(c, 300);
      CHECK(run.y.shape().dim(0) == x.dim(0));
    }
  }
}

// H 13 and ffn 37 take the padded path (ops/layernorm_mlp/detail/gpu_steps.hpp) in every dtype.
TEST_CASE_TEMPLATE("layernorm_mlp on the GPU gives bitwise the same output and gradients on every run and policy", T,
                   TAPEGRAD_GPU_DTYPES) {
  for (Activation act : {Activation::gelu, Activation::swiglu, Activation::clamped_swiglu}) {
    for (NormType norm : {NormType::layernorm, NormType::rmsnorm}) {
      for (const bool odd : {false, true}) {
        Case c{.options = options_for(act, norm, Recompute::save_all, true, false),
               .x = odd ? Shape{5, 13} : Shape{2, 3, 24},
               .ffn = odd ? 37 : 40};
        CAPTURE(describe(c));
        const InputPlan p = plan(c);
        const std::vector<Tensor<T>> values = draw<T>(c, p, 400);
        const auto f = [&](const auto& v) { return block_of_inputs(c, v); };
        auto run = [&] { return test::run_op<T, T>(f, p.inputs, values, nullptr, test::gpu, 401); };
        const auto first = run();
        for (Recompute recompute : all_policies) {
          c.options.recompute = recompute;
          const std::string policy(recompute_name(recompute));
          CAPTURE(policy);
          const auto again = run();
          CHECK(test::bitwise_equal(first.y, again.y));
          for (std::size_t k = 0; k < p.inputs.size(); ++k) {
            CAPTURE(k);
            CHECK(test::bitwise_equal(first.grads[k], again.grads[k]));
          }
        }
      }
    }
  }
}

// The backward releases the saved h and z as it goes (and writes dz over z): under retain_graph a second backward
// recomputes them and must give the same gradients, so the accumulated ones are exactly twice the first.
TEST_CASE_TEMPLATE("layernorm_mlp on the GPU gives the same gradients on a second backward under retain_graph", T,
                   TAPEGRAD_GPU_DTYPES) {
  for (Activation act : {Activation::gelu, Activation::swiglu}) {
    const Case c{.options = options_for(act, NormType::layernorm, Recompute::save_all, false, false),
                 .x = Shape{6, 24}};
    CAPTURE(describe(c));
    const InputPlan p = plan(c);
    const std::vector<Tensor<T>> values = draw<T>(c, p, 450);
    std::vector<Var<T>> inputs;
    for (const Tensor<T>& v : values) inputs.push_back(param(v.to(test::gpu)));
    const Var<T> y = block_of_inputs(c, inputs);
    const Tensor<T> dy = randn<T>(y.shape(), 460).to(test::gpu);
    backward(y, dy, {.retain_graph = true});
    std::vector<Tensor<double>> once;
    for (const Var<T>& v : inputs) once.push_back(cast<double>(v.grad().to(Device::cpu())));
    backward(y, dy);
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      CAPTURE(k);
      const Tensor<double> twice = cast<double>(inputs[k].grad().to(Device::cpu()));
      for (std::int64_t i = 0; i < twice.numel(); ++i) REQUIRE(twice.flat(i) == 2 * once[k].flat(i));
    }
  }
}

// Mixed precision: parameters in f32, x (and so h, z, a, y) in T. Against the double reference on the same values,
// within T's tolerance: W1, W2, γ and β are rounded to T on the GPU, an error of T's rounding like every stage's.
TEST_CASE_TEMPLATE("layernorm_mlp on the GPU with f32 parameters gives f32 gradients that match the CPU", T,
                   TAPEGRAD_GPU_DTYPES) {
  for (Activation act : {Activation::gelu, Activation::swiglu}) {
    const Case c{.options = options_for(act, NormType::layernorm, Recompute::recompute_norm, true, false),
                 .x = Shape{5, 24}};
    CAPTURE(describe(c));
    const InputPlan p = plan(c);
    const std::vector<Tensor<T>> x_draw = draw<T>(c, p, 500);
    std::vector<Tensor<float>> param_values;
    for (std::size_t k = 1; k < p.inputs.size(); ++k) {
      param_values.push_back(randn<float>(p.inputs[k].shape, 510 + k, p.mean[k], p.stddev[k]));
    }
    const Tensor<T> dy = randn<T>({5, 48}, 520);

    const Var<T> x = param(x_draw[0].to(test::gpu));
    std::vector<Var<float>> params;
    for (const Tensor<float>& v : param_values) params.push_back(param(v.to(test::gpu)));
    const Var<T> y = block<T, float>(c, x, params);
    backward(y, dy.to(test::gpu));

    const Var<double> xd = param(cast<double>(x_draw[0]));
    std::vector<Var<double>> ref;
    for (const Tensor<float>& v : param_values) ref.push_back(param(cast<double>(v)));
    const Var<double> yd = block<double, double>(c, xd, ref);
    backward(yd, cast<double>(dy));

    // The f32 parameter gradients are rounded to f32 once: even in f64 compute they are 1 f32 ulp from the double
    // reference at worst.
    const Tolerance param_tol{std::max(tolerance<T>.rtol, 1.2e-7), std::max(tolerance<T>.atol, 1.2e-7)};
    test::check_close(y.value().to(Device::cpu()), yd.value(), tolerance<T>);
    test::check_close(x.grad().to(Device::cpu()), xd.grad(), tolerance<T>);
    for (std::size_t k = 0; k < params.size(); ++k) {
      CAPTURE(k);
      CHECK(params[k].grad().device() == test::gpu);
      test::check_close(params[k].grad().to(Device::cpu()), ref[k].grad(), param_tol);
    }
    if constexpr (std::is_same_v<T, bf16>) {
      // W1's gradient is rounded once from sums in f32, not from bf16 ones: most of it is no bf16 value.
      const Tensor<float> dw1 = params[2].grad().to(Device::cpu());
      std::int64_t not_bf16 = 0;
      for (std::int64_t i = 0; i < dw1.numel(); ++i) not_bf16 += float(bf16(dw1.flat(i))) != dw1.flat(i);
      CHECK(not_bf16 > dw1.numel() / 2);
    }
  }
}

TEST_CASE("layernorm_mlp on the GPU keeps its outputs and gradients on the GPU, and refuses inputs on two devices") {
  const Case c{.options = options_for(Activation::geglu, NormType::layernorm, Recompute::save_all, true, false),
               .x = Shape{4, 13}};
  const InputPlan p = plan(c);
  std::vector<Var<float>> on_gpu;
  for (std::size_t k = 0; k < p.inputs.size(); ++k) {
    on_gpu.push_back(param(randn<float>(p.inputs[k].shape, 600 + k).to(test::gpu)));
  }
  const Var<float> y = block_of_inputs(c, on_gpu);
  CHECK(y.device() == test::gpu);
  backward(y, ones<float>(y.shape(), test::gpu));
  for (const Var<float>& v : on_gpu) CHECK(v.grad().device() == test::gpu);

  std::vector<Var<float>> mixed = on_gpu;
  mixed[1] = constant(randn<float>(p.inputs[1].shape, 610));  // gamma on the cpu
  CHECK_THROWS_WITH_AS(block_of_inputs(c, mixed), doctest::Contains("layernorm_mlp: input 0 is on cuda:0 but input 1 is on cpu"),
                       Error);
  std::vector<Var<float>> bad_shape = on_gpu;
  bad_shape[3] = constant(randn<float>({13, 2, 7}, 611).to(test::gpu));  // w1 with a different F
  CHECK_THROWS_WITH_AS(block_of_inputs(c, bad_shape), doctest::Contains("layernorm_mlp: w2 has shape [40, 13] but w1 has shape"),
                       Error);
}

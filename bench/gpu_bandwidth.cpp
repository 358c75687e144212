// GPU bandwidth of the elementwise program kernel, the layernorm kernels, layernorm_mlp's activation kernel and fp8
// quantization (and, beside them, the card's own device-to-device copy, the reference): GB/s = bytes the kernel must
// read and write / median time. Sizes from 1 MiB to 1 GiB per tensor.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tapegrad/cuda/elementwise.hpp"
#include "tapegrad/cuda/fp8_quantize.hpp"
#include "tapegrad/cuda/mlp_activation.hpp"
#include "gpu_timing.hpp"
#include "tapegrad/tapegrad.hpp"

namespace bench {

namespace {

const tapegrad::Device gpu = tapegrad::Device::cuda(0);

void report(const char* kernel, const char* dtype, std::int64_t numel, double bytes, const Timing& t) {
  JsonLine("gpu_bandwidth")
      .str("kernel", kernel)
      .str("dtype", dtype)
      .num("numel", static_cast<double>(numel))
      .num("bytes", bytes)
      .num("gb_per_s", bytes / t.median_ns)
      .timing(t);
}

template <class T> void elementwise_group(const char* dtype) {
  using namespace tapegrad;
  NoGradGuard no_grad;
  for (const std::int64_t numel : {std::int64_t{1} << 18, std::int64_t{1} << 22, std::int64_t{1} << 26,
                                   std::int64_t{1} << 28}) {
    const double size = static_cast<double>(numel) * sizeof(T);
    const Tensor<T> x = randn<T>({numel}, 1, 0, 1, gpu);
    report("copy", dtype, numel, 2 * size, measure_gpu([&] { (void)x.clone(); }));
    const Var<T> a = constant(x), b = constant(randn<T>({numel}, 2, 0, 1, gpu)),
                 c = constant(randn<T>({numel}, 3, 0, 1, gpu));
    report("x * 2", dtype, numel, 2 * size, measure_gpu([&] { (void)eval(a * 2.0); }));
    report("a * b + c", dtype, numel, 4 * size, measure_gpu([&] { (void)eval(a * b + c); }));
    report("gelu_tanh(a)", dtype, numel, 2 * size, measure_gpu([&] { (void)eval(gelu_tanh(a)); }));
    const std::int64_t cols = 4096, rows = numel / cols;
    const Var<T> m = constant(x.reshape({rows, cols})), bias = constant(randn<T>({cols}, 4, 0, 1, gpu));
    report("m + bias[cols]", dtype, numel, 2 * size, measure_gpu([&] { (void)eval(m + bias); }));
  }
  // The interpreting kernel on the largest size, for comparison with the made kernels above.
  const std::int64_t numel = std::int64_t{1} << 28;
  const double size = static_cast<double>(numel) * sizeof(T);
  const tapegrad::cuda::ElementCompilation previous = tapegrad::cuda::element_compilation();
  tapegrad::cuda::set_element_compilation(tapegrad::cuda::ElementCompilation::never);
  const Var<T> a = constant(randn<T>({numel}, 1, 0, 1, gpu)), b = constant(randn<T>({numel}, 2, 0, 1, gpu)),
               c = constant(randn<T>({numel}, 3, 0, 1, gpu));
  report("x * 2, interpreted", dtype, numel, 2 * size, measure_gpu([&] { (void)eval(a * 2.0); }));
  report("a * b + c, interpreted", dtype, numel, 4 * size, measure_gpu([&] { (void)eval(a * b + c); }));
  report("gelu_tanh(a), interpreted", dtype, numel, 2 * size, measure_gpu([&] { (void)eval(gelu_tanh(a)); }));
  tapegrad::cuda::set_element_compilation(previous);
}

// A backward pass alone, timed as forward and backward minus forward (the tape records the forward each time).
Timing backward_alone(const Timing& both, const Timing& forward) {
  return {both.median_ns - forward.median_ns, both.min_ns - forward.min_ns, both.reps};
}

// Forward, forward and backward, and backward alone of y = f(inputs) with the gradient dy.
template <class T, class F>
void report_passes(const char* kernel, const char* dtype, std::int64_t numel, double forward_bytes,
                   double backward_bytes, std::vector<tapegrad::Var<T>> inputs, const tapegrad::Tensor<T>& dy, F&& f) {
  using namespace tapegrad;
  const Timing forward = measure_gpu([&] {
    (void)f(inputs);
    Tape::active().clear();
  });
  const Timing both = measure_gpu([&] {
    backward(f(inputs), dy);
    for (Var<T>& v : inputs) v.zero_grad();
    Tape::active().clear();
  });
  const std::string name(kernel);
  report((name + " forward").c_str(), dtype, numel, forward_bytes, forward);
  report((name + " forward+backward").c_str(), dtype, numel, forward_bytes + backward_bytes, both);
  report((name + " backward").c_str(), dtype, numel, backward_bytes, backward_alone(both, forward));
}

// a * b + c: forward reads a, b, c and writes y; backward (one program) reads a, b, dy and writes da, db, dc.
template <class T> void backward_group(const char* dtype) {
  using namespace tapegrad;
  const std::int64_t numel = std::int64_t{1} << 28;  // as the largest forward, to compare with the same copy
  const double size = static_cast<double>(numel) * sizeof(T);
  report_passes<T>("a * b + c", dtype, numel, 4 * size, 6 * size,
                   {param(randn<T>({numel}, 1, 0, 1, gpu)), param(randn<T>({numel}, 2, 0, 1, gpu)),
                    param(randn<T>({numel}, 3, 0, 1, gpu))},
                   randn<T>({numel}, 9, 0, 1, gpu), [](const auto& v) { return Var<T>(v[0] * v[1] + v[2]); });
}

// layernorm over rows of 4096: forward reads x and writes y; backward reads x and dy and writes dx (γ, β, the
// statistics and the dγ/dβ partials are a few rows' worth, not counted).
template <class T> void layernorm_group(const char* dtype) {
  using namespace tapegrad;
  // 8192 rows: layernorm_mlp's large blocks (one wave of the backward's blocks).
  for (const std::int64_t rows :
       {std::int64_t{1} << 10, std::int64_t{1} << 13, std::int64_t{1} << 14, std::int64_t{1} << 16}) {
    const std::int64_t hidden = 4096, numel = rows * hidden;
    const double size = static_cast<double>(numel) * sizeof(T);
    const Var<T> gamma = constant(randn<T>({hidden}, 3, 1, 0.1, gpu));
    const Var<T> beta = constant(randn<T>({hidden}, 4, 0, 1, gpu));
    report_passes<T>("layernorm", dtype, numel, 2 * size, 3 * size, {param(randn<T>({rows, hidden}, 1, 0, 1, gpu))},
                     randn<T>({rows, hidden}, 2, 0, 1, gpu),
                     [&](const auto& v) { return layernorm(v[0], gamma, beta); });
  }
}

// layernorm_mlp's activation kernel on the blocks' z (8192 rows; GELU: F 16384, SwiGLU: both halves of F 11008; and
// gpt_1k's 4096 x 4096, where the kernel is short and db1's partial sums weigh more), called directly. Forward reads
// z, writes a; backward reads z and da, writes dz and a (for dW2) and the chunks' partial sums of db1 (not counted).
template <class T> void mlp_activation_group(const char* dtype) {
  using namespace tapegrad;
  using C = compute_t<T>;
  const ActivationForm gelu{ActivationFunction::gelu_tanh, ActivationGate::none};
  const ActivationForm swiglu{ActivationFunction::swish, ActivationGate::linear};
  const struct {
    const char* name;
    ActivationForm act;
    std::int64_t rows, F;
  } forms[] = {{"mlp_activation gelu", gelu, 8192, 16384},
               {"mlp_activation swiglu", swiglu, 8192, 11008},
               {"mlp_activation gelu", gelu, 4096, 4096}};
  for (const auto& [name, act, rows, F] : forms) {
    const std::int64_t width = act.width(), numel = rows * F;
    const double size = static_cast<double>(numel) * sizeof(T);
    const Tensor<T> z = randn<T>({rows, width * F}, 1, 0, 1, gpu), da = randn<T>({rows, F}, 2, 0, 1, gpu);
    Tensor<T> a({rows, F}, gpu), dz({rows, width * F}, gpu), dbias({width * F}, gpu);
    Tensor<C> partials({cuda::mlp_activation_partials(rows, F, static_cast<int>(width))}, gpu);
    const std::string label(name);
    report((label + " forward").c_str(), dtype, numel, (width + 1) * size, measure_gpu([&] {
             cuda::mlp_activation_forward(dtype_v<T>, gpu.index, act, z.data(), a.data(), rows, F);
           }));
    report((label + " backward").c_str(), dtype, numel, 2 * (width + 1) * size, measure_gpu([&] {
             cuda::mlp_activation_backward(
                 dtype_v<T>, gpu.index, act, z.data(), da.data(),
                 {.dz = dz.data(), .a = a.data(), .dbias = dbias.data(), .partials = partials.data()}, rows, F);
           }));
  }
}

// fp8 quantization of bf16 x [rows, cols] (a scale known ahead, as delayed scaling's) at the shapes a TransformerLayer
// quantizes (hidden 4096: x, dy and o; dQKV; the MLP's dz; W1): reads x, writes its codes and their transpose (4
// bytes an element); the same with x's column sums (a bias gradient's partial rows, not counted), and the codes alone
// (3 bytes).
void fp8_quantize_group() {
  using namespace tapegrad;
  const Tensor<float> scale = full<float>({1}, 8.0f).to(gpu);
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{8192, 4096}, {8192, 12288}, {8192, 16384},
                                   {4096, 16384}}) {
    const std::int64_t numel = rows * cols;
    const Tensor<bf16> x = randn<bf16>({rows, cols}, 1, 0, 1, gpu);
    Tensor<f8e4m3> codes({rows, cols}, gpu), transposed({cols, rows}, gpu);
    Tensor<float> partials({cuda::fp8_column_partial_rows(rows), cols}, gpu);
    const auto quantize = [&](bool with_transpose, bool with_sums) {
      cuda::fp8_quantize({.dtype = DType::bf16,
                          .x = x.data(),
                          .rows = rows,
                          .cols = cols,
                          .scale = scale.data(),
                          .codes = codes.data(),
                          .transposed = with_transpose ? transposed.data() : nullptr,
                          .column_partials = with_sums ? partials.data() : nullptr},
                         gpu.index);
    };
    const std::string shape = " [" + std::to_string(rows) + " x " + std::to_string(cols) + "]";
    const double elements = static_cast<double>(numel);
    report(("fp8_quantize codes and transpose" + shape).c_str(), "bf16", numel, 4 * elements,
           measure_gpu([&] { quantize(true, false); }));
    report(("fp8_quantize codes, transpose and column sums" + shape).c_str(), "bf16", numel, 4 * elements,
           measure_gpu([&] { quantize(true, true); }));
    report(("fp8_quantize codes" + shape).c_str(), "bf16", numel, 3 * elements,
           measure_gpu([&] { quantize(false, false); }));
  }
}

}  // namespace

void gpu_bandwidth() {
  if (!gpu_available("gpu_bandwidth")) return;
  elementwise_group<float>("f32");
  elementwise_group<tapegrad::bf16>("bf16");
  backward_group<float>("f32");
  backward_group<tapegrad::bf16>("bf16");
  layernorm_group<float>("f32");
  layernorm_group<tapegrad::bf16>("bf16");
  mlp_activation_group<float>("f32");
  mlp_activation_group<tapegrad::bf16>("bf16");
  fp8_quantize_group();
}

}  // namespace bench

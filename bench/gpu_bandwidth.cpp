// GPU bandwidth of the elementwise program kernel and of the layernorm kernels (and, beside them, the card's own
// device-to-device copy, the reference): GB/s = bytes the kernel must read and write / median time. Sizes from
// 1 MiB to 1 GiB per tensor.
#include <cstdint>
#include <string>

#include "cuda/elementwise.hpp"
#include "gpu_timing.hpp"
#include "tapegrad.hpp"

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

// The backward program of a * b + c: reads a, b, dy, writes da, db, dc.
template <class T> void backward_group(const char* dtype) {
  using namespace tapegrad;
  const std::int64_t numel = std::int64_t{1} << 26;
  const double size = static_cast<double>(numel) * sizeof(T);
  const Tensor<T> dy = randn<T>({numel}, 9, 0, 1, gpu);
  Var<T> a = param(randn<T>({numel}, 1, 0, 1, gpu)), b = param(randn<T>({numel}, 2, 0, 1, gpu)),
         c = param(randn<T>({numel}, 3, 0, 1, gpu));
  report("backward of a * b + c", dtype, numel, 6 * size, measure_gpu([&] {
           Var<T> y = a * b + c;
           backward(y, dy);
           a.zero_grad();
           b.zero_grad();
           c.zero_grad();
           Tape::active().clear();
         }));
}

// layernorm over rows of 4096: forward reads x and writes y; backward reads x and dy and writes dx (γ, β, the
// statistics and the dγ/dβ partials are a few rows' worth, not counted).
template <class T> void layernorm_group(const char* dtype) {
  using namespace tapegrad;
  for (const std::int64_t rows : {std::int64_t{1} << 10, std::int64_t{1} << 14, std::int64_t{1} << 16}) {
    const std::int64_t hidden = 4096, numel = rows * hidden;
    const double size = static_cast<double>(numel) * sizeof(T);
    const Tensor<T> x = randn<T>({rows, hidden}, 1, 0, 1, gpu), dy = randn<T>({rows, hidden}, 2, 0, 1, gpu);
    const Var<T> gamma = constant(randn<T>({hidden}, 3, 1, 0.1, gpu));
    const Var<T> beta = constant(randn<T>({hidden}, 4, 0, 1, gpu));
    {
      NoGradGuard no_grad;
      report("layernorm forward", dtype, numel, 2 * size,
             measure_gpu([&] { (void)layernorm(constant(x), gamma, beta); }));
    }
    Var<T> xv = param(x);
    report("layernorm backward", dtype, numel, 3 * size, measure_gpu([&] {
             Var<T> y = layernorm(xv, gamma, beta);
             backward(y, dy);
             xv.zero_grad();
             Tape::active().clear();
           }));
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
}

}  // namespace bench

// (d) Matrix product throughput on the GPU through cuBLASLt, forward only: TFLOP/s = 2·M·N·K / median time, at
// transformer sizes, in bf16 (also with cuda::set_gemm_autotune) and f16 (f32 accumulation) and f32 (exact FP32,
// and TF32). Two ways: cuda::gemm, the
// entry point, into a preallocated output; and tapegrad's matmul under NoGradGuard (which takes its output from the
// device's pool each call). Each repetition is timed alone between two CUDA events on the device's current stream;
// the median after warm-up is reported. Without a GPU it prints one line saying it skipped.
#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/tensor/gpu/device.hpp"
#include "gpu_timing.hpp"
#include "tapegrad/tapegrad.hpp"

namespace bench {

namespace {

using namespace tapegrad;

const Device gpu = Device::cuda(0);

// Random operands on the GPU, drawn once per shape in f32 and rounded to each dtype.
struct Operands {
  Tensor<float> a, b;
};

template <class T> void product(const Operands& host, const char* math, const std::string& device_name) {
  const std::int64_t M = host.a.dim(0), K = host.a.dim(1), N = host.b.dim(1);
  const Tensor<T> A = cast<T>(host.a).to(gpu), B = cast<T>(host.b).to(gpu);
  Tensor<T> C({M, N}, gpu);
  const cuda::GemmArgs args{.dtype = dtype_v<T>, .M = M, .N = N, .K = K, .a = {A.data(), K}, .b = {B.data(), N},
                            .c = {C.data(), N}};
  const char* const impls[] = {"blaslt_gemm", "tapegrad_matmul"};
  const std::vector<Timing> timings = measure_gpu({[&] { cuda::gemm(args, 0); },
                                                   [&] {
                                                     NoGradGuard no_grad;
                                                     tapegrad::matmul(constant(A), constant(B));
                                                   }});
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  for (std::size_t k = 0; k < timings.size(); ++k) {
    JsonLine line("gpu_matmul");
    line.str("impl", impls[k]).str("device", device_name).shape({M, K}, "a").shape({K, N}, "b");
    line.str("dtype", dtype_name(dtype_v<T>)).str("math", math);
    line.num("reps", timings[k].reps).num("median_ns", timings[k].median_ns).num("min_ns", timings[k].min_ns);
    line.num("median_ms", timings[k].median_ns / 1e6).num("tflops", flops / timings[k].median_ns / 1e3);
  }
}

}  // namespace

void gpu_matmul() {
  if (!gpu_available("gpu_matmul")) return;
  const std::string device_name = cuda::device_description(0);
  // [M, K] · [K, N]: square products, a wide-K one, and a transformer MLP's up projection (8192 tokens, 4096 → 11008).
  const std::int64_t shapes[][3] = {
      {4096, 4096, 4096}, {8192, 8192, 8192}, {8192, 16384, 4096}, {8192, 4096, 11008}};
  std::uint64_t seed = 1;
  for (const auto& [M, K, N] : shapes) {
    const Operands host{randn<float>({M, K}, seed), randn<float>({K, N}, seed + 1)};
    seed += 2;
    product<bf16>(host, "f32 accumulate", device_name);
    cuda::set_gemm_autotune(true);
    product<bf16>(host, "f32 accumulate, autotuned", device_name);
    cuda::set_gemm_autotune(false);
    product<f16>(host, "f32 accumulate", device_name);
    product<float>(host, "fp32", device_name);
    const bool was_allowed = cuda::allow_tf32();
    cuda::set_allow_tf32(true);
    product<float>(host, "tf32", device_name);
    cuda::set_allow_tf32(was_allowed);
  }
}

}  // namespace bench

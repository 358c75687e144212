// A digest of layernorm_mlp's results over its options, to tell whether a change to the node moved any bit: for every
// activation × norm × recompute policy × precision (bf16, fp8 delayed over two steps, current, block) in f32, bf16
// with f32 parameters (sizes that need padding on a GPU), f64 and f16, one line with a hash of y (and h where it is
// returned) and of each gradient. Built from two trees (say with git worktree), the same command's outputs compare
// with diff.
//   layernorm_mlp_digest [cpu|cuda]    (TAPEGRAD_GEMM=blas on the CPU: one GEMM engine for both builds)
#include <cstdint>
#include <cstdio>
#include <string>

#include "tapegrad/config.hpp"
#include "tapegrad/cuda/settings.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;

namespace {

// FNV-1a over the bytes of t (on the host).
template <class T> std::uint64_t digest(const Tensor<T>& t) {
  if (!t.defined()) return 0;
  const Tensor<T> host = t.to(Device::cpu());
  std::uint64_t h = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
  const std::size_t size = static_cast<std::size_t>(host.numel()) * sizeof(T);
  for (std::size_t i = 0; i < size; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

struct Case {
  NormType norm;
  Activation activation;
  Recompute recompute;
  bool zero_centered, biases, return_h;
  int fp8;  // 0: none; 1, 2, 3: delayed, current, block scaling
};

template <class T, class P>
void run(const char* name, const Case& c, Device device, std::int64_t M, std::int64_t H, std::int64_t F) {
  std::uint64_t seed = 17;
  const auto leaf = [&](const Shape& shape, double scale) {
    return param(cast<P>(randn<double>(shape, seed++, 0.0, scale)).to(device));
  };
  const std::int64_t n = activation_width(c.activation);
  Var<P> gamma = leaf({H}, 0.5), beta = c.norm == NormType::layernorm ? leaf({H}, 0.3) : Var<P>();
  Var<P> w1 = leaf({H, n, F}, 0.2), w2 = leaf({F, H}, 0.2);
  Var<P> b1 = c.biases ? leaf({n, F}, 0.1) : Var<P>(), b2 = c.biases ? leaf({H}, 0.1) : Var<P>();
  Var<T> x = param(cast<T>(randn<double>({M, H}, seed++)).to(device));
  LayerNormMLPOptions o{.norm = c.norm,
                        .zero_centered_gamma = c.zero_centered,
                        .activation = c.activation,
                        .return_layernorm_output = c.return_h,
                        .recompute = c.recompute};
  if (c.fp8 == 1) o.fp8 = fp8_quantization(fp8::DelayedScaling{});
  if (c.fp8 == 2) o.fp8 = fp8_quantization(fp8::CurrentScaling{});
  if (c.fp8 == 3) o.fp8 = fp8_quantization(fp8::BlockScaling{});
  const Tensor<T> dy = cast<T>(randn<double>({M, H}, 99)).to(device);
  const Tensor<T> dh = cast<T>(randn<double>({M, H}, 98)).to(device);
  for (int step = 0; step < (c.fp8 == 1 ? 2 : 1); ++step) {  // delayed scaling's second step uses the first's amaxes
    Tape::active().clear();
    zero_grad(x, gamma, w1, w2);
    for (Var<P>* v : {&beta, &b1, &b2}) {
      if (v->defined()) v->zero_grad();
    }
    const LayerNormMLPOutput<T> out = layernorm_mlp(x, gamma, beta, {w1, w2}, {b1, b2}, o);
    Var<T> loss = sum(out.y * constant(dy));
    if (c.return_h) loss = loss + sum(out.layernorm_output * constant(dh));
    backward(loss);
    std::printf("%s norm %d act %d recompute %d zc %d biases %d h %d fp8 %d step %d: y %016llx", name, int(c.norm),
                int(c.activation), int(c.recompute), c.zero_centered, c.biases, c.return_h, c.fp8, step,
                static_cast<unsigned long long>(digest(out.y.value())));
    if (c.return_h) std::printf(" h %016llx", static_cast<unsigned long long>(digest(out.layernorm_output.value())));
    std::printf(" dx %016llx", static_cast<unsigned long long>(digest(x.grad())));
    for (const Var<P>* v : {&gamma, &beta, &w1, &b1, &w2, &b2}) {
      std::printf(" %016llx", static_cast<unsigned long long>(v->defined() ? digest(v->grad()) : 0));
    }
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool gpu = argc > 1 && std::string(argv[1]) == "cuda";
  const Device device = gpu ? Device::cuda(0) : Device::cpu();
#ifdef TAPEGRAD_HAVE_CUDA
  if (gpu) cuda::set_fp8_dispatch(cuda::Fp8Dispatch::always);  // (these blocks are far below where fp8 pays)
#endif
  // On a GPU 136 and 264 are whole 16-byte rows of bf16, 133 and 261 are not (the node pads them).
  const std::int64_t M = gpu ? 200 : 33, H = gpu ? 136 : 40, F = gpu ? 264 : 72;
  const std::int64_t odd_H = gpu ? 133 : 40, odd_F = gpu ? 261 : 72;
  for (int a = 0; a < 12; ++a) {
    for (NormType norm : {NormType::layernorm, NormType::rmsnorm}) {
      for (Recompute recompute : {Recompute::save_all, Recompute::recompute_norm, Recompute::recompute_all}) {
        for (int fp8 = 0; fp8 < 4; ++fp8) {
          const Case c{norm,
                       static_cast<Activation>(a),
                       recompute,
                       (a + int(recompute)) % 2 == 1,
                       (a + int(norm)) % 3 != 0,
                       (a + fp8) % 2 == 1,
                       fp8};
          run<float, float>("f32", c, device, M, H, F);
          run<bf16, float>("bf16/f32", c, device, M, odd_H, odd_F);
          if (fp8 == 0 || !gpu) run<double, double>("f64", c, device, M, H, F);  // (fp8 on a GPU: no f64)
          run<f16, f16>("f16", c, device, M, H, F);
        }
      }
    }
  }
}

#include "cuda/mlp_activation.hpp"

#include "cuda/activation_math.hpp"
#include "cuda/launch.cuh"

namespace tapegrad::cuda {

namespace {

namespace act = tapegrad::activation;

// fn(x), and fn'(x) into *grad unless null. Clamps differentiate as torch.clamp: 1 on the closed interval.
template <class C> __device__ __forceinline__ C function_of(const MlpActivation& a, C x, C* grad) {
  switch (a.fn) {
    case MlpFunction::relu: return act::relu(x, grad);
    case MlpFunction::gelu_tanh: return act::gelu_tanh(x, grad);
    case MlpFunction::swish: return act::swish(x, C(a.alpha), grad);
    case MlpFunction::squared_relu: return act::squared_relu(x, grad);
    case MlpFunction::sigmoid: {
      const C s = act::sigmoid(x);
      if (grad) *grad = s * (C(1) - s);
      return s;
    }
    default: {  // clamped_swish: swish of min(x, limit)
      const C limit = C(a.limit);
      const C value = act::swish(x < limit ? x : limit, C(a.alpha), grad);
      if (grad && !(x <= limit)) *grad = C(0);
      return value;
    }
  }
}

template <class C> __device__ __forceinline__ C gate_of(const MlpActivation& a, C x, C* grad) {
  if (a.gate == MlpGate::linear) {
    if (grad) *grad = C(1);
    return x;
  }
  const C limit = C(a.limit);  // clamped_linear: clamp(x, ±limit) + 1
  if (grad) *grad = fabs(x) <= limit ? C(1) : C(0);
  return (x < -limit ? -limit : (x > limit ? limit : x)) + C(1);
}

constexpr int threads = 256;

// One walk over a's elements for both directions. The forward (Backward = false) is the backward without da and dz:
// it loads only z, takes no derivatives and always writes a.
template <class S, bool Backward>
__global__ void activation_kernel(const MlpActivation act, const S* z, const S* da, S* a, S* dz, std::int64_t rows,
                                  std::int64_t F) {
  using C = compute_of<S>;
  const int width = act.width();
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < rows * F;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t f = i % F, row = i / F * width * F;  // z's and dz's row
    const C d = Backward ? to_compute<C>(da[i]) : C(0);
    C grad, gate_grad;
    C value = function_of<C>(act, to_compute<C>(z[row + f]), Backward ? &grad : nullptr);
    if (width == 2) {
      const C gate = gate_of<C>(act, to_compute<C>(z[row + F + f]), Backward ? &gate_grad : nullptr);
      if constexpr (Backward) {
        dz[row + f] = from_compute<S>(d * gate * grad);
        dz[row + F + f] = from_compute<S>(d * value * gate_grad);
      }
      value *= gate;
    } else if constexpr (Backward) {
      dz[row + f] = from_compute<S>(d * grad);
    }
    if (!Backward || a) a[i] = from_compute<S>(value);
  }
}

template <class S, bool Backward>
void launch_activation(int device, const MlpActivation& act, const void* z, const void* da, void* a, void* dz,
                       std::int64_t rows, std::int64_t F) {
  if (rows * F == 0) return;
  Launch launch(device);
  activation_kernel<S, Backward><<<launch.blocks_for(rows * F, threads), threads, 0, launch.stream()>>>(
      act, static_cast<const S*>(z), static_cast<const S*>(da), static_cast<S*>(a), static_cast<S*>(dz), rows, F);
  TAPEGRAD_CUDA_CHECK_LAUNCH();
}

}  // namespace

void mlp_activation_forward(DType dtype, int device, const MlpActivation& act, const void* z, void* a,
                            std::int64_t rows, std::int64_t F) {
  dispatch_float(dtype, "layernorm_mlp", [&](auto tag) {
    launch_activation<decltype(tag), false>(device, act, z, nullptr, a, nullptr, rows, F);
  });
}

void mlp_activation_backward(DType dtype, int device, const MlpActivation& act, const void* z, const void* da,
                             void* a, void* dz, std::int64_t rows, std::int64_t F) {
  dispatch_float(dtype, "layernorm_mlp", [&](auto tag) {
    launch_activation<decltype(tag), true>(device, act, z, da, a, dz, rows, F);
  });
}

}  // namespace tapegrad::cuda

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

template <class S>
__global__ void forward_kernel(const MlpActivation act, const S* z, S* a, std::int64_t rows, std::int64_t F) {
  using C = compute_of<S>;
  const int width = act.width();
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < rows * F;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = i / F, f = i % F;
    const S* zr = z + r * width * F;
    C value = function_of<C>(act, to_compute<C>(zr[f]), nullptr);
    if (width == 2) value *= gate_of<C>(act, to_compute<C>(zr[F + f]), nullptr);
    a[i] = from_compute<S>(value);
  }
}

template <class S>
__global__ void backward_kernel(const MlpActivation act, const S* z, const S* da, S* a, S* dz, std::int64_t rows,
                                std::int64_t F) {
  using C = compute_of<S>;
  const int width = act.width();
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < rows * F;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = i / F, f = i % F;
    const S* zr = z + r * width * F;
    S* dzr = dz + r * width * F;
    const C d = to_compute<C>(da[i]);
    C grad;
    C value = function_of<C>(act, to_compute<C>(zr[f]), &grad);
    if (width == 2) {
      C gate_grad;
      const C gate = gate_of<C>(act, to_compute<C>(zr[F + f]), &gate_grad);
      dzr[f] = from_compute<S>(d * gate * grad);
      dzr[F + f] = from_compute<S>(d * value * gate_grad);
      value *= gate;
    } else {
      dzr[f] = from_compute<S>(d * grad);
    }
    if (a) a[i] = from_compute<S>(value);
  }
}

}  // namespace

void mlp_activation_forward(DType dtype, int device, const MlpActivation& act, const void* z, void* a,
                            std::int64_t rows, std::int64_t F) {
  if (rows * F == 0) return;
  Launch launch(device);
  dispatch_float(dtype, "layernorm_mlp", [&](auto tag) {
    using S = decltype(tag);
    forward_kernel<S><<<launch.blocks_for(rows * F, threads), threads, 0, launch.stream()>>>(
        act, static_cast<const S*>(z), static_cast<S*>(a), rows, F);
    TAPEGRAD_CUDA_CHECK_LAUNCH();
  });
}

void mlp_activation_backward(DType dtype, int device, const MlpActivation& act, const void* z, const void* da,
                             void* a, void* dz, std::int64_t rows, std::int64_t F) {
  if (rows * F == 0) return;
  Launch launch(device);
  dispatch_float(dtype, "layernorm_mlp", [&](auto tag) {
    using S = decltype(tag);
    backward_kernel<S><<<launch.blocks_for(rows * F, threads), threads, 0, launch.stream()>>>(
        act, static_cast<const S*>(z), static_cast<const S*>(da), static_cast<S*>(a), static_cast<S*>(dz), rows, F);
    TAPEGRAD_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace tapegrad::cuda

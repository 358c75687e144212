// Fused optimizer updates: one thread per element (grid-stride) applies the parameter's update rule; elements are
// independent, so the result does not depend on the grid and needs no synchronization.
#include "tapegrad/cuda/optim.hpp"

#include <type_traits>

#include "tapegrad/tensor/gpu/detail/launch.cuh"

namespace tapegrad::cuda {

namespace {

// The state buffers as a kernel argument (passed by value).
template <class S> struct StateBuffers {
  S* buffer[optim::max_state_buffers];
};

template <class T, class S, class Rule>
__global__ void optimizer_step_kernel(T* param, const T* grad, StateBuffers<S> state, std::int64_t n, Rule rule) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    S p = to_compute<S>(param[i]);
    rule(p, to_compute<S>(grad[i]), state.buffer, i);
    param[i] = from_compute<T>(p);
  }
}

template <class T, class S, class Rule> void launch_step(const ParameterBuffers& b, const Rule& rule) {
  StateBuffers<S> state{};
  for (int k = 0; k < optim::max_state_buffers; ++k) state.buffer[k] = static_cast<S*>(b.state[k]);
  Launch launch(b.device);
  constexpr int threads = 256;
  optimizer_step_kernel<T, S><<<launch.blocks_for(b.size, threads), threads, 0, launch.stream()>>>(
      static_cast<T*>(b.param), static_cast<const T*>(b.grad), state, b.size, rule);
  TAPEGRAD_CUDA_CHECK_LAUNCH();
}

// Launches `rule` (in precision S) on the parameter, whose dtype must be one that keeps its state in S.
template <class S, class Rule> void step(const ParameterBuffers& b, const Rule& rule) {
  if (b.size == 0) return;
  dispatch_float(b.dtype, "optimizer_step", [&](auto tag) {
    using T = decltype(tag);
    constexpr bool state_in_f64 = std::is_same_v<T, double>;
    check(state_in_f64 == std::is_same_v<S, double>, "optimizer_step", "a ", dtype_name(b.dtype),
          " parameter keeps its state in ", state_in_f64 ? "f64" : "f32", ", but the rule computes in ",
          std::is_same_v<S, double> ? "f64" : "f32");
    if constexpr (state_in_f64 == std::is_same_v<S, double>) launch_step<T, S>(b, rule);
  });
}

}  // namespace

void optimizer_step(const ParameterBuffers& buffers, const optim::SGDRule<float>& rule) { step<float>(buffers, rule); }
void optimizer_step(const ParameterBuffers& buffers, const optim::SGDRule<double>& rule) {
  step<double>(buffers, rule);
}
void optimizer_step(const ParameterBuffers& buffers, const optim::AdamRule<float>& rule) {
  step<float>(buffers, rule);
}
void optimizer_step(const ParameterBuffers& buffers, const optim::AdamRule<double>& rule) {
  step<double>(buffers, rule);
}

}  // namespace tapegrad::cuda

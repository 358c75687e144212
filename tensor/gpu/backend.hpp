// Whether this build has the CUDA backend, and the one way code forks between the CPU and a GPU.
//
// A build without CUDA declares the GPU launchers but does not define them: code reaches them only through
// by_device's GPU branch, which such a build discards at compile time. (It has no device tensors either: allocating
// one throws.)
#pragma once

#include <string_view>
#include <utility>

#include "tapegrad/config.hpp"
#include "tapegrad/tensor/core/device.hpp"

namespace tapegrad {

namespace cuda {
#ifdef TAPEGRAD_HAVE_CUDA
inline constexpr bool enabled = true;
#else
inline constexpr bool enabled = false;
#endif
}  // namespace cuda

namespace detail {
[[noreturn]] void throw_without_cuda(std::string_view op, Device device);

// The library defines the constructor of only one of these, the one its own build configured: a program whose
// tapegrad headers say otherwise (headers of another build, or TAPEGRAD_HAVE_CUDA changed by hand) fails to link,
// naming the mismatch, instead of running with two views of the same types.
#ifdef TAPEGRAD_HAVE_CUDA
struct HeadersConfiguredWithCuda {
  HeadersConfiguredWithCuda();
};
static const HeadersConfiguredWithCuda headers_configured;
#else
struct HeadersConfiguredWithoutCuda {
  HeadersConfiguredWithoutCuda();
};
static const HeadersConfiguredWithoutCuda headers_configured;
#endif
}  // namespace detail

// on_cpu() for a cpu device, on_gpu(device) for a GPU. `on_gpu` must be a generic lambda (`[&](auto device)`): in a
// build without CUDA its body is never instantiated, so the launchers it calls need no definition, and a GPU device
// throws "<op>: device cuda:N is not available: tapegrad was built without CUDA".
template <class OnCpu, class OnGpu>
decltype(auto) by_device(std::string_view op, Device device, OnCpu&& on_cpu, OnGpu&& on_gpu) {
  if (device.is_cpu()) return std::forward<OnCpu>(on_cpu)();
  if constexpr (cuda::enabled) {
    return std::forward<OnGpu>(on_gpu)(device);
  } else {
    detail::throw_without_cuda(op, device);
  }
}

}  // namespace tapegrad

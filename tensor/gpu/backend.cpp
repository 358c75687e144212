#include "tapegrad/tensor/gpu/backend.hpp"

#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::detail {

void throw_without_cuda(std::string_view op, Device device) {
  throw Error(concat(op, ": device ", device, " is not available: tapegrad was built without CUDA"));
}

#ifdef TAPEGRAD_HAVE_CUDA
HeadersConfiguredWithCuda::HeadersConfiguredWithCuda() = default;
#else
HeadersConfiguredWithoutCuda::HeadersConfiguredWithoutCuda() = default;
#endif

}  // namespace tapegrad::detail

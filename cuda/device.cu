#include "cuda/device.hpp"

#include "cuda/check.cuh"

namespace tapegrad::cuda {

int device_count() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    cudaGetLastError();  // clear the sticky error so later calls are not confused by it
    return 0;
  }
  TAPEGRAD_CUDA_CHECK(err);
  return count;
}

std::string device_description(int index) {
  const int count = device_count();
  check(index >= 0 && index < count, "cuda", "device cuda:", index, " does not exist (", count,
        " CUDA devices are visible)");
  cudaDeviceProp prop{};
  TAPEGRAD_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  const double gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
         std::to_string(static_cast<int>(gib + 0.5)) + " GiB)";
}

}  // namespace tapegrad::cuda

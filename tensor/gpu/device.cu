#include "tapegrad/tensor/gpu/device.hpp"

#include <mutex>
#include <vector>

#include "tapegrad/tensor/gpu/detail/check.cuh"

namespace tapegrad::cuda {

namespace {
int query_device_count() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    cudaGetLastError();  // clear the error so that later checks are not confused by it
    return 0;
  }
  TAPEGRAD_CUDA_CHECK(err);
  return count;
}
}  // namespace

int device_count() {
  static const int count = query_device_count();  // the visible devices do not change while the process runs
  return count;
}

void check_device_index(int index, const char* op) {
  const int count = device_count();
  if (index >= 0 && index < count) return;
  check(count > 0, op, "device cuda:", index, " is not available: no CUDA device is visible");
  check(false, op, "device cuda:", index, " does not exist (", count,
        count == 1 ? " CUDA device is visible)" : " CUDA devices are visible)");
}

std::string device_description(int index) {
  check_device_index(index, "cuda");
  cudaDeviceProp prop{};
  TAPEGRAD_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  const double gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
         std::to_string(static_cast<int>(gib + 0.5)) + " GiB)";
}

namespace {

// Attribute `attribute` of device `index`, read once per device.
template <cudaDeviceAttr attribute> int cached_attribute(int index) {
  check_device_index(index, "cuda");
  static std::vector<std::once_flag> ready(static_cast<std::size_t>(device_count()));
  static std::vector<int> values(static_cast<std::size_t>(device_count()));
  const auto i = static_cast<std::size_t>(index);
  std::call_once(ready[i], [&] { TAPEGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&values[i], attribute, index)); });
  return values[i];
}

}  // namespace

int multiprocessor_count(int index) { return cached_attribute<cudaDevAttrMultiProcessorCount>(index); }

int l2_cache_bytes(int index) { return cached_attribute<cudaDevAttrL2CacheSize>(index); }

bool overlaps_launches(int index) { return cached_attribute<cudaDevAttrComputeCapabilityMajor>(index) >= 9; }

}  // namespace tapegrad::cuda

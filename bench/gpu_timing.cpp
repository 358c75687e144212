#include "gpu_timing.hpp"

#include <cuda_runtime.h>

#include "tapegrad/tensor/gpu/detail/check.cuh"
#include "tapegrad/tensor/gpu/device.hpp"
#include "tapegrad/tensor/gpu/memory.hpp"

namespace bench {

namespace {
class Event {
 public:
  Event() { TAPEGRAD_CUDA_CHECK(cudaEventCreate(&event_)); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};
}  // namespace

std::vector<Timing> measure_gpu(const std::vector<std::function<void()>>& runs, int device) {
  const cudaStream_t stream = tapegrad::cuda::current_stream(device);
  Event start, stop;
  return repeat(runs.size(), [&](std::size_t k) {
    TAPEGRAD_CUDA_CHECK(cudaEventRecord(start.get(), stream));
    runs[k]();
    TAPEGRAD_CUDA_CHECK(cudaEventRecord(stop.get(), stream));
    TAPEGRAD_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0;
    TAPEGRAD_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    return static_cast<double>(ms) * 1e6;
  });
}

bool gpu_available(const char* group) {
  if (tapegrad::cuda::device_count() > 0) return true;
  JsonLine(group).str("skipped", "no CUDA device visible");
  return false;
}

}  // namespace bench

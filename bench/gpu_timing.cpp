#include "gpu_timing.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda/check.cuh"
#include "cuda/device.hpp"
#include "cuda/memory.hpp"

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

Timing measure_gpu(const std::function<void()>& run, int device) {
  const cudaStream_t stream = tapegrad::cuda::current_stream(device);
  Event start, stop;
  auto once = [&] {
    TAPEGRAD_CUDA_CHECK(cudaEventRecord(start.get(), stream));
    run();
    TAPEGRAD_CUDA_CHECK(cudaEventRecord(stop.get(), stream));
    TAPEGRAD_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0;
    TAPEGRAD_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    return static_cast<double>(ms) * 1e6;
  };
  for (int i = 0; i < budget.warmup; ++i) once();
  std::vector<double> ns;
  double total = 0;
  while (static_cast<int>(ns.size()) < budget.max_reps &&
         (static_cast<int>(ns.size()) < budget.min_reps || total < budget.min_seconds * 1e9)) {
    ns.push_back(once());
    total += ns.back();
  }
  std::sort(ns.begin(), ns.end());
  const std::size_t n = ns.size();
  return {n % 2 ? ns[n / 2] : (ns[n / 2 - 1] + ns[n / 2]) / 2, ns.front(), static_cast<int>(n)};
}

bool gpu_available(const char* group) {
  if (tapegrad::cuda::device_count() > 0) return true;
  JsonLine(group).str("skipped", "no CUDA device visible");
  return false;
}

}  // namespace bench

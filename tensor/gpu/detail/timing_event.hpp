// A CUDA event that times work on a stream, destroyed with its owner: the benchmarks' timings and the autotuning of
// cuDNN's attention plans (cuda/cudnn_graph.cpp). Internal.
#pragma once

#include <cuda_runtime.h>

#include "tapegrad/tensor/gpu/detail/check.cuh"

namespace tapegrad::cuda {

class TimingEvent {
 public:
  TimingEvent() { TAPEGRAD_CUDA_CHECK(cudaEventCreate(&event_)); }
  ~TimingEvent() { cudaEventDestroy(event_); }
  TimingEvent(const TimingEvent&) = delete;
  TimingEvent& operator=(const TimingEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Milliseconds from start to stop, both recorded on the stream, waiting for stop.
inline float elapsed_ms(const TimingEvent& start, const TimingEvent& stop) {
  TAPEGRAD_CUDA_CHECK(cudaEventSynchronize(stop.get()));
  float ms = 0;
  TAPEGRAD_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return ms;
}

}  // namespace tapegrad::cuda

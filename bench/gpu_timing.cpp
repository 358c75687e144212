#include "gpu_timing.hpp"

#include <cuda_runtime.h>

#include <chrono>

#include "tapegrad/autodiff/tape.hpp"
#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/gpu/detail/check.cuh"
#include "tapegrad/tensor/gpu/detail/timing_event.hpp"
#include "tapegrad/tensor/gpu/device.hpp"
#include "tapegrad/tensor/gpu/memory.hpp"

namespace bench {

std::vector<Timing> measure_gpu(const std::vector<std::function<void()>>& runs, int device) {
  const cudaStream_t stream = tapegrad::cuda::current_stream(device);
  const tapegrad::cuda::TimingEvent start, stop;
  return repeat(runs.size(), [&](std::size_t k) {
    TAPEGRAD_CUDA_CHECK(cudaEventRecord(start.get(), stream));
    runs[k]();
    TAPEGRAD_CUDA_CHECK(cudaEventRecord(stop.get(), stream));
    return static_cast<double>(tapegrad::cuda::elapsed_ms(start, stop)) * 1e6;
  });
}

Timing host_queue_time(const std::function<void()>& run, int device) {
  const Timing t = repeat(1, [&](std::size_t) {
    tapegrad::cuda::synchronize(device);
    const auto start = std::chrono::steady_clock::now();
    run();
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  })[0];
  tapegrad::cuda::synchronize(device);
  return t;
}

double peak_extra_mib(const std::function<void()>& run, int device) {
  tapegrad::cuda::synchronize(device);
  tapegrad::cuda::reset_peak_memory(device);
  const std::size_t before = tapegrad::cuda::memory_stats(device).in_use;
  run();
  tapegrad::cuda::synchronize(device);
  return static_cast<double>(tapegrad::cuda::memory_stats(device).peak_in_use - before) / (1 << 20);
}

double held_after_mib(const std::function<void()>& run, int device) {
  tapegrad::cuda::synchronize(device);
  const std::size_t before = tapegrad::cuda::memory_stats(device).in_use;
  run();
  tapegrad::cuda::synchronize(device);
  return (static_cast<double>(tapegrad::cuda::memory_stats(device).in_use) - static_cast<double>(before)) / (1 << 20);
}

std::optional<std::string> failure_of(const std::function<void()>& run, int device) {
  try {
    run();
    return std::nullopt;
  } catch (const tapegrad::Error& e) {
    tapegrad::Tape::active().clear();
    tapegrad::cuda::synchronize(device);
    return e.what();
  }
}

bool gpu_available(const char* group) {
  if (tapegrad::cuda::device_count() > 0) return true;
  JsonLine(group).str("skipped", "no CUDA device visible");
  return false;
}

}  // namespace bench

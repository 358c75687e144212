// Timing GPU work: CUDA events recorded around each repetition on the device's current stream, under the same
// budget (warm-up, repetitions round-robin, median) as the host timings of bench.hpp. Built with CUDA only; the GPU
// groups skip themselves (one JSON line) when no GPU is visible.
#pragma once

#include <functional>
#include <vector>

#include "bench.hpp"

namespace bench {

// Times each of `runs` (each queues work on device `device`'s current stream) between two events.
std::vector<Timing> measure_gpu(const std::vector<std::function<void()>>& runs, int device = 0);
inline Timing measure_gpu(const std::function<void()>& run, int device = 0) {
  return measure_gpu(std::vector<std::function<void()>>{run}, device)[0];
}

// Whether a GPU is visible; if not, writes one JSON line saying that `group` was skipped.
bool gpu_available(const char* group);

}  // namespace bench

// Timing GPU work: CUDA events around each repetition on the device's current stream, the same budget (warm-up,
// repetitions, median) as the host timings of bench.hpp. The GPU groups skip themselves when no GPU is visible.
#pragma once

#include <functional>

#include "bench.hpp"

namespace bench {

// Times `run` (which queues work on device `device`'s current stream) by events recorded before and after it.
Timing measure_gpu(const std::function<void()>& run, int device = 0);

// Whether a GPU is visible; if not, writes one JSON line saying that `group` was skipped.
bool gpu_available(const char* group);

}  // namespace bench

// Timing GPU work: CUDA events recorded around each repetition on the device's current stream, under the same
// budget (warm-up, repetitions round-robin, median) as the host timings of bench.hpp. Built with CUDA only; the GPU
// groups skip themselves (one JSON line) when no GPU is visible.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench.hpp"

namespace bench {

// Times each of `runs` (each queues work on device `device`'s current stream) between two events.
std::vector<Timing> measure_gpu(const std::vector<std::function<void()>>& runs, int device = 0);
inline Timing measure_gpu(const std::function<void()>& run, int device = 0) {
  return measure_gpu(std::vector<std::function<void()>>{run}, device)[0];
}

// The host's time to queue one `run` on an idle device (each repetition after the device has finished; bench.hpp's
// budget and median): a step whose host time exceeds its device time leaves the GPU waiting for launches.
Timing host_queue_time(const std::function<void()>& run, int device = 0);

// The peak extra device memory of one more `run`, in MiB: the most tapegrad held during it beyond what it held
// before (inputs and parameters), as the peers' peak_extra_mib. Run it after the timed repetitions, which leave the
// pool warm.
double peak_extra_mib(const std::function<void()>& run, int device = 0);
// The device memory in use after run() beyond what was in use before it, in MiB (what run() made and still holds).
double held_after_mib(const std::function<void()>& run, int device = 0);

// Runs one case of a group. If it throws tapegrad::Error (above all OutOfMemoryError: a case too large for the
// device), clears the tape, waits for the device and returns the message, for the group to report and go on.
std::optional<std::string> failure_of(const std::function<void()>& run, int device = 0);

// Whether a GPU is visible; if not, writes one JSON line saying that `group` was skipped.
bool gpu_available(const char* group);

}  // namespace bench

// Which CUDA devices this process can use. Plain C++: callable from code that does not include CUDA headers.
#pragma once

#include <string>

namespace tapegrad::cuda {

// Number of usable CUDA devices, read once per process; 0 when there is no GPU or no driver (never throws for that).
int device_count();
// Throws tapegrad::Error "<op>: device cuda:N does not exist (K CUDA devices are visible)" (or "is not available:
// no CUDA device is visible") unless 0 <= index < device_count().
void check_device_index(int index, const char* op);
// "NVIDIA H200 (sm_90, 139 GiB)"; throws tapegrad::Error for a device index that does not exist.
std::string device_description(int index);
// The device's number of streaming multiprocessors, read once per device (for grid sizes).
int multiprocessor_count(int index);

// The device's L2 cache size in bytes, read once per device.
int l2_cache_bytes(int index);

// Whether a kernel may be launched to start while the one before it finishes (programmatic dependent launch:
// compute capability 9.0 and up; see launch_overlapped in tensor/gpu/detail/launch.cuh).
bool overlaps_launches(int index);

}  // namespace tapegrad::cuda

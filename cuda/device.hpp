// Which CUDA devices this process can use. Plain C++: callable from code that does not include CUDA headers.
#pragma once

#include <string>

namespace tapegrad::cuda {

// Number of usable CUDA devices; 0 when there is no GPU or no driver (never throws for that case).
int device_count();
// "NVIDIA H200 (sm_90, 139 GiB)"; throws tapegrad::Error for a device index that does not exist.
std::string device_description(int index);

}  // namespace tapegrad::cuda

// OnDevice: makes a device the CUDA runtime's current device of this thread for a scope, so that launches and
// calls without a device argument act on it.
#pragma once

#include <cuda_runtime.h>

#include "tapegrad/tensor/gpu/detail/check.cuh"

namespace tapegrad::cuda {

class OnDevice {
 public:
  explicit OnDevice(int device) : device_(device) {
    TAPEGRAD_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device_) TAPEGRAD_CUDA_CHECK(cudaSetDevice(device_));
  }
  ~OnDevice() {
    if (previous_ != device_) cudaSetDevice(previous_);  // cannot fail for a device that was current before
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int device_;
  int previous_ = 0;
};

}  // namespace tapegrad::cuda

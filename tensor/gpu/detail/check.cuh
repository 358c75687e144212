// Every CUDA runtime call and kernel launch goes through these checks: a failure throws tapegrad::Error naming
// the call, the file and line, and CUDA's own description of the error. The runtime also keeps a failed call's
// error as its "last error", which the launch check reads: throwing clears it, so that a later launch is not blamed
// for it (an error that corrupts the context stays sticky regardless).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  cudaGetLastError();
  throw Error(std::string("CUDA error at ") + file + ":" + std::to_string(line) + ": " + call + " failed: " +
              cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace tapegrad::cuda

#define TAPEGRAD_CUDA_CHECK(call)                                                      \
  do {                                                                                 \
    const cudaError_t tapegrad_err_ = (call);                                          \
    if (tapegrad_err_ != cudaSuccess) {                                                \
      ::tapegrad::cuda::throw_cuda_error(tapegrad_err_, #call, __FILE__, __LINE__);    \
    }                                                                                  \
  } while (0)

// After a <<<...>>> launch: reports a bad launch configuration at once.
#define TAPEGRAD_CUDA_CHECK_LAUNCH() TAPEGRAD_CUDA_CHECK(cudaGetLastError())

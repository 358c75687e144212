// Every cuBLASLt call goes through TAPEGRAD_CUBLAS_CHECK(call, context): a status other than success throws
// tapegrad::Error naming the call, the file and line, cuBLAS's name and description of the status, and `context`
// (an expression giving anything printable, e.g. the problem's shapes), which is evaluated only on failure.
#pragma once

#include <cublasLt.h>

#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::cuda {

template <class Context>
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const Context& context, const char* file,
                                     int line) {
  throw Error(detail::concat("cuBLASLt error at ", file, ":", line, ": ", call, " failed: ",
                             cublasLtGetStatusName(status), " (", cublasLtGetStatusString(status), ") for ", context));
}

}  // namespace tapegrad::cuda

#define TAPEGRAD_CUBLAS_CHECK(call, context)                                                          \
  do {                                                                                                \
    const cublasStatus_t tapegrad_status_ = (call);                                                   \
    if (tapegrad_status_ != CUBLAS_STATUS_SUCCESS) {                                                  \
      ::tapegrad::cuda::throw_cublas_error(tapegrad_status_, #call, (context), __FILE__, __LINE__);    \
    }                                                                                                 \
  } while (0)

// Kernels made for single elementwise programs (cuda/element_source.hpp), compiled by NVRTC on first use and kept
// for the process: one compilation per program shape (instructions, dtype, layout kind, which inputs are read how,
// wide outputs) and GPU architecture, whatever the scalars, sizes and pointers. Plain C++.
#pragma once

#include <string>
#include <vector>

#include "tapegrad/cuda/element_source.hpp"

namespace tapegrad::cuda {

// The cubin NVRTC makes of `source` for `arch` (like "sm_90"), with the headers element_arithmetic.hpp needs;
// throws tapegrad::Error with NVRTC's log if it does not compile. Needs no GPU.
std::vector<char> compile_element_kernel(const std::string& source, const std::string& arch);

// The kernel made for `program` in `form`, for `device`'s architecture (compiled on first use, thread-safe), as
// the handle cudaLaunchKernel takes; null where this NVRTC cannot compile for that architecture (the interpreter
// runs the program then).
const void* element_kernel(const ElementProgram& program, const ElementKernelForm& form, int device);

}  // namespace tapegrad::cuda

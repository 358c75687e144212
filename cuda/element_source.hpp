// The CUDA source of a kernel made for one elementwise program (compiled at run time by cuda/element_jit.hpp).
// The interpreting kernel (cuda/elementwise.cu) decodes every instruction and moves every value through switched
// registers for every group of elements, which costs it half the card's bandwidth on 16-bit tensors; the kernel made
// here is the program as straight-line code: all its inputs loaded at the top (16 bytes at a time), the arithmetic
// in named values, the stores at the end. The arithmetic is the same function (cuda/element_arithmetic.hpp), so the
// two kernels give the same bits. Plain C++.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "tapegrad/cuda/elementwise.hpp"

namespace tapegrad::cuda {

// How an input is read by a made kernel: not at all, as V contiguous values at its offset, or as one value for the
// V elements of a group (broadcast along the rows).
enum class InputRead : std::uint8_t { unused, vector, broadcast };

// What a made kernel is specialized for besides its program's instructions (whose scalars it reads as parameters,
// so that programs differing in constants only share a kernel).
struct ElementKernelForm {
  DType dtype = DType::f32;
  bool flat = true;  // every input laid out like the output; otherwise rows (a broadcast layout)
  int rank = 0;  // of a rows layout (flat: 0)
  bool narrow = false;  // every element index and input offset below 2^30: 32-bit index arithmetic
  std::array<InputRead, max_element_inputs> inputs{};
  std::array<bool, max_element_outputs> wide{};

  bool operator==(const ElementKernelForm&) const = default;
};

// The kernel's parameters after layout and buffers (ElementLayout, ElementBuffers): each instruction's scalar.
struct ElementScalars {
  double value[max_element_program] = {};
};

inline constexpr const char* element_kernel_name = "tapegrad_element_program";

// The values a thread loads at once from an input, 16 bytes of the dtype (one vector load; a warp's load covers
// whole 32-byte sectors): a made kernel covers n / group groups, the rest is interpreted.
inline int element_kernel_group(DType dtype) { return 16 / static_cast<int>(dtype_size(dtype)); }

// The kernel `element_kernel_name`(ElementLayout, ElementBuffers, ElementScalars, long long groups) that runs
// `program` on groups · element_kernel_group(dtype) elements.
std::string element_kernel_source(const ElementProgram& program, const ElementKernelForm& form);

}  // namespace tapegrad::cuda

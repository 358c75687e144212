// Elementwise programs: the GPU side of tapegrad's fused elementwise expressions. Plain C++.
//
// The expression templates are compiled by the host compiler, so they cannot instantiate kernels. Instead the
// host turns an expression (and, for backward, the gradient of each operand) into a short register program
// (ops/detail/element_term.hpp), and ONE kernel per dtype runs it for every element: loads from the inputs (with
// broadcast strides), arithmetic in the compute type (f32 for bf16/f16) in registers, stores to the outputs. One
// launch per expression, forward or backward, whatever its size, with 16-byte loads and stores when every input
// and output is contiguous and aligned. Large runs get a kernel made for their program instead (see below).
#pragma once

#include <cstdint>

#include "tapegrad/cuda/detail/element_op.hpp"
#include "tapegrad/cuda/settings.hpp"
#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

struct ElementInstruction {
  ElementOp op = ElementOp::constant;
  std::uint8_t dst = 0, a = 0, b = 0;
  double scalar = 0;
};

inline constexpr int element_registers = 8;  // a program's registers (each holds one value per element)
inline constexpr int max_element_program = 96;
inline constexpr int max_element_inputs = 16;
inline constexpr int max_element_outputs = 16;
inline constexpr int max_element_rank = 6;

struct ElementProgram {
  int size = 0;
  ElementInstruction code[max_element_program];
};

// Where each input's element sits for each output element. The output index space is `dims` (row-major, already
// merged: adjacent axes that every input walks alike are one); input k's element is Σ coord[d]·strides[k][d],
// with stride 0 along the axes it is broadcast over. `flat` when every input is laid out like the output.
struct ElementLayout {
  int rank = 1;
  std::int64_t dims[max_element_rank] = {};
  std::int64_t strides[max_element_inputs][max_element_rank] = {};
  bool flat = true;
};

// The buffers of one run: inputs in `dtype`; outputs in `dtype`, or, where `wide[j]`, in its compute type (f32 for
// bf16/f16) for a sum that follows. Every output has the output index space's size, contiguous.
struct ElementBuffers {
  const void* inputs[max_element_inputs] = {};
  void* outputs[max_element_outputs] = {};
  bool wide[max_element_outputs] = {};
};

// Runs `program` over the `n` elements of the output index space on `device`'s current stream.
void run_element_program(DType dtype, int device, const ElementProgram& program, const ElementLayout& layout,
                         const ElementBuffers& buffers, std::int64_t n);

}  // namespace tapegrad::cuda

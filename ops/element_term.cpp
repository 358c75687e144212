// Compiling Terms into register programs: each tree is evaluated in Sethi–Ullman order (the operand that needs
// more registers first), which needs as few registers as the tree allows (log2 of its leaves, plus one, at most).
// Shared subtrees are evaluated again where they recur, as the CPU's expression templates do.
#include "tapegrad/ops/detail/element_term.hpp"

#include <algorithm>

#include "tapegrad/cuda/elementwise.hpp"
#include "tapegrad/ops/detail/element_layout.hpp"
#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad {

namespace {

using Node = Term::Node;

bool is_binary(cuda::ElementOp op) {
  return op == cuda::ElementOp::add || op == cuda::ElementOp::sub || op == cuda::ElementOp::mul ||
         op == cuda::ElementOp::div || op == cuda::ElementOp::pow;
}

int registers_needed(const Node& n) {
  if (!n.a) return 1;
  if (!n.b) return registers_needed(*n.a);
  const int a = registers_needed(*n.a), b = registers_needed(*n.b);
  return a == b ? a + 1 : std::max(a, b);
}

class Compiler {
 public:
  explicit Compiler(const std::string& what) : what_(what) {}

  // Emits the code that leaves n's value in register `base`, using registers base and up.
  void emit(const Node& n, int base) {
    check(base < cuda::element_registers, what_, "the expression is too deep for a GPU program (it needs more than ",
          cuda::element_registers, " registers): evaluate a part of it first with .eval()");
    const auto dst = static_cast<std::uint8_t>(base);
    if (n.op == cuda::ElementOp::input) {
      push({n.op, dst, static_cast<std::uint8_t>(n.input), 0, 0.0});
    } else if (n.op == cuda::ElementOp::constant) {
      push({n.op, dst, 0, 0, n.scalar});
    } else if (!is_binary(n.op)) {
      emit(*n.a, base);
      push({n.op, dst, dst, 0, n.scalar});
    } else if (registers_needed(*n.a) >= registers_needed(*n.b)) {
      emit(*n.a, base);
      emit(*n.b, base + 1);
      push({n.op, dst, dst, static_cast<std::uint8_t>(base + 1), 0.0});
    } else {
      emit(*n.b, base);
      emit(*n.a, base + 1);
      push({n.op, dst, static_cast<std::uint8_t>(base + 1), dst, 0.0});
    }
  }
  void store(int output) { push({cuda::ElementOp::store, static_cast<std::uint8_t>(output), 0, 0, 0.0}); }
  const cuda::ElementProgram& program() const { return program_; }

 private:
  void push(const cuda::ElementInstruction& in) {
    check(program_.size < cuda::max_element_program, what_, "the expression is too long for a GPU program (more than ",
          cuda::max_element_program, " instructions with its gradients): evaluate a part of it first with .eval()");
    program_.code[program_.size++] = in;
  }

  const std::string& what_;
  cuda::ElementProgram program_;
};

// The register program computing every term.
cuda::ElementProgram compile_elements(const std::vector<TermOutput>& terms, const std::string& what) {
  Compiler compiler(what);
  for (const TermOutput& out : terms) {
    compiler.emit(out.term.node(), 0);
    compiler.store(out.output);
  }
  return compiler.program();
}

}  // namespace

void run_terms(DType dtype, Device device, const std::vector<TermOutput>& terms, const Shape& output,
               const std::vector<Shape>& input_shapes, const std::vector<const void*>& inputs,
               const std::vector<void*>& outputs, const std::string& what) {
  // element_layout checks the input count; there are never more outputs than inputs (a value, or one gradient per
  // leaf), so both fit the buffers' arrays.
  const cuda::ElementLayout layout = element_layout(output, input_shapes, what);
  const cuda::ElementProgram program = compile_elements(terms, what);
  cuda::ElementBuffers buffers;
  std::copy(inputs.begin(), inputs.end(), buffers.inputs);
  std::copy(outputs.begin(), outputs.end(), buffers.outputs);
  for (const TermOutput& t : terms) buffers.wide[t.output] = t.wide;
  cuda::run_element_program(dtype, device.index, program, layout, buffers, output.numel());
}

}  // namespace tapegrad

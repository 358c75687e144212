// The kernels made per elementwise program (cuda/element_source.hpp) compile with NVRTC for every dtype, layout
// kind and instruction. Runs without a GPU (NVRTC needs none): CI checks the generated source on every commit; the
// GPU suite checks that made kernels give the interpreter's bits (test_gpu_elementwise.cpp).
#include <doctest/doctest.h>

#include <string>

#include "tapegrad/cuda/element_jit.hpp"
#include "tapegrad/tensor/core/error.hpp"

using namespace tapegrad;
using namespace tapegrad::cuda;

namespace {

void push(ElementProgram& p, ElementOp op, int dst, int a, int b, double scalar = 0.0) {
  p.code[p.size++] = {op, static_cast<std::uint8_t>(dst), static_cast<std::uint8_t>(a), static_cast<std::uint8_t>(b),
                      scalar};
}

// Every arithmetic instruction once, chained through register 0: r0 = op(r0, r1) or op(r0); then r0 to output 0
// and r1 to output 1 (a wide one).
ElementProgram every_instruction() {
  ElementProgram p;
  push(p, ElementOp::input, 0, 0, 0);
  push(p, ElementOp::input, 1, 1, 0);
  push(p, ElementOp::constant, 2, 0, 0, 0.5);
  push(p, ElementOp::mul, 1, 1, 2);
#define TAPEGRAD_PUSH_BINARY(name) push(p, ElementOp::name, 0, 0, 1);
#define TAPEGRAD_PUSH_UNARY(name) push(p, ElementOp::name, 0, 0, 0, 1.5);
  TAPEGRAD_BINARY_ELEMENT_OPS(TAPEGRAD_PUSH_BINARY)
  TAPEGRAD_UNARY_ELEMENT_OPS(TAPEGRAD_PUSH_UNARY)
#undef TAPEGRAD_PUSH_BINARY
#undef TAPEGRAD_PUSH_UNARY
  push(p, ElementOp::store, 0, 0, 0);
  push(p, ElementOp::store, 1, 1, 0);
  return p;
}

}  // namespace

TEST_CASE("every instruction compiles into a made kernel, for every dtype, layout kind and index width") {
  const ElementProgram program = every_instruction();
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (const bool flat : {true, false}) {
      for (const bool narrow : {true, false}) {
        ElementKernelForm form{.dtype = dtype, .flat = flat, .rank = flat ? 0 : 3, .narrow = narrow};
        form.inputs[0] = InputRead::vector;
        form.inputs[1] = flat ? InputRead::vector : InputRead::broadcast;
        form.wide[1] = true;
        CAPTURE(dtype_name(dtype));
        CAPTURE(flat);
        CAPTURE(narrow);
        const std::string source = element_kernel_source(program, form);
        CHECK(source.find(element_kernel_name) != std::string::npos);
        CHECK_FALSE(compile_element_kernel(source, "sm_90").empty());
      }
    }
  }
}

TEST_CASE("a made kernel's form must read every input its program loads") {
  const ElementProgram program = every_instruction();
  ElementKernelForm form;
  form.inputs[0] = InputRead::vector;  // input 1 left unused
  CHECK_THROWS_WITH_AS(element_kernel_source(program, form), doctest::Contains("reads input 1"), Error);
}

TEST_CASE("NVRTC's log reaches the error of a source that does not compile") {
  CHECK_THROWS_WITH_AS(compile_element_kernel("this is not CUDA", "sm_90"),
                       doctest::Contains("NVRTC could not compile"), Error);
}

// The instructions of an elementwise program (cuda/elementwise.hpp). The arithmetic ones are listed once, in the
// two X-macros below, for the enum, the interpreting kernel's dispatch and the kernels compiled per program.
// Plain C++ without includes: NVRTC compiles it too.
#pragma once

// r[dst] = r[a] op r[b]
#define TAPEGRAD_BINARY_ELEMENT_OPS(X) X(add) X(sub) X(mul) X(div) X(pow)
// r[dst] = op(r[a]), with the instruction's scalar as a parameter (swish: x·σ(scalar·x))
#define TAPEGRAD_UNARY_ELEMENT_OPS(X)                                                                         \
  X(neg) X(exp) X(log) X(sqrt) X(rsqrt) X(square) X(abs) X(sign) X(tanh) X(sigmoid) X(relu) X(relu_grad)     \
  X(squared_relu) X(squared_relu_grad) X(swish) X(swish_grad) X(gelu_tanh) X(gelu_tanh_grad) X(gelu_erf)     \
  X(gelu_erf_grad)

namespace tapegrad::cuda {

#define TAPEGRAD_ELEMENT_OP_NAME(name) name,
enum class ElementOp : unsigned char {
  input,     // r[dst] = input a at this element
  constant,  // r[dst] = scalar
  store,     // output dst at this element = r[a]
  TAPEGRAD_BINARY_ELEMENT_OPS(TAPEGRAD_ELEMENT_OP_NAME) TAPEGRAD_UNARY_ELEMENT_OPS(TAPEGRAD_ELEMENT_OP_NAME)
};
#undef TAPEGRAD_ELEMENT_OP_NAME

}  // namespace tapegrad::cuda

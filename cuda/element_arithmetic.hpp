// What each arithmetic instruction of an elementwise program computes, on one value of the compute type C (f32 or
// f64). Written once for the kernel that interprets programs (cuda/elementwise.cu) and for the kernels compiled per
// program (cuda/element_source.cpp emits calls to it), so that both give the same bits. Plain C++ that NVRTC
// compiles too: of the standard library it uses only <cmath>'s functions.
#pragma once

#include <cmath>

#include "tapegrad/cuda/detail/element_op.hpp"
#include "tapegrad/cuda/detail/activation_math.hpp"
#include "tapegrad/tensor/core/detail/host_device.hpp"

namespace tapegrad::cuda {

// The derivative an activation of activation_math.hpp stores through its `grad` pointer.
template <class C, class F> TAPEGRAD_HOST_DEVICE inline C derivative(F&& with_grad) {
  C grad{};
  with_grad(&grad);
  return grad;
}

// x op y for a binary instruction; op(x) for a unary one, whose scalar parameter is s. Fast: the program stores
// 16-bit values, and the sigmoids take the GPU's fast exp and division (activation_math.hpp); the interpreter and
// the made kernels pass the same flag for the same dtype, so they still agree bitwise.
template <ElementOp Op, class C, bool Fast = false> TAPEGRAD_HOST_DEVICE inline C element_arithmetic(C x, C y, C s) {
  namespace act = tapegrad::activation;
  if constexpr (Op == ElementOp::add) return x + y;
  else if constexpr (Op == ElementOp::sub) return x - y;
  else if constexpr (Op == ElementOp::mul) return x * y;
  else if constexpr (Op == ElementOp::div) return x / y;
  else if constexpr (Op == ElementOp::pow) return std::pow(x, y);
  else if constexpr (Op == ElementOp::neg) return -x;
  else if constexpr (Op == ElementOp::exp) return std::exp(x);
  else if constexpr (Op == ElementOp::log) return std::log(x);
  else if constexpr (Op == ElementOp::sqrt) return std::sqrt(x);
  else if constexpr (Op == ElementOp::rsqrt) return C(1) / std::sqrt(x);
  else if constexpr (Op == ElementOp::square) return x * x;
  else if constexpr (Op == ElementOp::abs) return std::fabs(x);
  else if constexpr (Op == ElementOp::sign) return x > C(0) ? C(1) : (x < C(0) ? C(-1) : x);
  else if constexpr (Op == ElementOp::tanh) return std::tanh(x);
  else if constexpr (Op == ElementOp::sigmoid) return act::sigmoid<Fast>(x);
  else if constexpr (Op == ElementOp::relu) return act::relu<C>(x, nullptr);
  else if constexpr (Op == ElementOp::relu_grad) return derivative<C>([&](C* g) { act::relu(x, g); });
  else if constexpr (Op == ElementOp::squared_relu) return act::squared_relu<C>(x, nullptr);
  else if constexpr (Op == ElementOp::squared_relu_grad) return derivative<C>([&](C* g) { act::squared_relu(x, g); });
  else if constexpr (Op == ElementOp::swish) return act::swish<Fast, C>(x, s, nullptr);
  else if constexpr (Op == ElementOp::swish_grad) return derivative<C>([&](C* g) { act::swish<Fast>(x, s, g); });
  else if constexpr (Op == ElementOp::gelu_tanh) return act::gelu_tanh<Fast, C>(x, nullptr);
  else if constexpr (Op == ElementOp::gelu_tanh_grad) {
    return derivative<C>([&](C* g) { act::gelu_tanh<Fast>(x, g); });
  }
  else if constexpr (Op == ElementOp::gelu_erf) return act::gelu_erf<C>(x, nullptr);
  else {
    static_assert(Op == ElementOp::gelu_erf_grad, "an arithmetic instruction of cuda/detail/element_op.hpp");
    return derivative<C>([&](C* g) { act::gelu_erf(x, g); });
  }
}

}  // namespace tapegrad::cuda

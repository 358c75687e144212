#include "tapegrad/ops/nn/dense.hpp"

#include "tapegrad/ops/matmul.hpp"

namespace tapegrad::nn {

// matmul runs [..., in] · [in, F] as one tall GEMM, forward and backward, with the bias added in its epilogue.
template <class U> Var<U> dense(const Var<U>& x, const Var<U>& kernel, const Var<U>& bias) {
  return bias.defined() ? matmul(x, kernel, bias) : matmul(x, kernel);
}

#define TAPEGRAD_INSTANTIATE_DENSE(U) template Var<U> dense<U>(const Var<U>&, const Var<U>&, const Var<U>&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_DENSE)

}  // namespace tapegrad::nn

#include "tapegrad/ops/nn/dense.hpp"

#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/matmul.hpp"

namespace tapegrad::nn {

// matmul runs [..., in] · [in, F] as one tall GEMM, forward and backward.
template <class U> Var<U> dense(const Var<U>& x, const Var<U>& kernel, const Var<U>& bias) {
  const Var<U> y = matmul(x, kernel);
  if (!bias.defined()) return y;
  return y + bias;
}

#define TAPEGRAD_INSTANTIATE_DENSE(U) template Var<U> dense<U>(const Var<U>&, const Var<U>&, const Var<U>&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_DENSE)

}  // namespace tapegrad::nn

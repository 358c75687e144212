// Misuse: mixing dtypes in one elementwise expression must not compile (cast one operand first).
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;

void use() {
  Var<float> a = param(ones<float>({2}));
#ifdef TAPEGRAD_MISUSE
  Var<double> b = param(ones<double>({2}));
#else
  Var<float> b = param(ones<float>({2}));
#endif
  Var<float> y = a * b;
  (void)y;
}

// Misuse: a float expression must not turn into a Var<double> (no silent conversion of dtype).
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;

void use() {
  Var<float> a = param(ones<float>({2}));
#ifdef TAPEGRAD_MISUSE
  Var<double> y = a * a + 1.0;
#else
  Var<float> y = a * a + 1.0;
#endif
  (void)y;
}

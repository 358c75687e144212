// Misuse: backward takes a Var, not an unevaluated expression (evaluate it first: backward(eval(a * b))).
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;

void use() {
  Var<double> a = param(ones<double>({})), b = param(ones<double>({}));
#ifdef TAPEGRAD_MISUSE
  backward(a * b);
#else
  backward(eval(a * b));
#endif
}

// Misuse: a custom op's backward must return each input's gradient in that input's own dtype.
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;

struct Saved {};

void use() {
  Var<double> x = param(ones<double>({2}));
  Var<double> y = custom_op<Saved>(
      "identity", [](Saved&, const Tensor<double>& in) { return in; },
      [](const Saved&, const NeedsGrad&, const Tensor<double>& dy) {
#ifdef TAPEGRAD_MISUSE
        return cast<float>(dy);
#else
        return dy;
#endif
      },
      x);
  (void)y;
}

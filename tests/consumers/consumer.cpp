// A program of a tapegrad user: built by .ci/consumers against an installed tapegrad (Meson's dependency(), CMake's
// find_package) and against tapegrad as a Meson subproject. Its include path puts shadow/ first, whose files have the
// relative paths of tapegrad's own headers and refuse to compile: tapegrad must never pick them up.
#include <cmath>
#include <cstdio>

#include <tapegrad/gpu.hpp>
#include <tapegrad/tapegrad.hpp>
#include <tapegrad/version.hpp>

int main() {
  using namespace tapegrad;
  const Var<double> x = param(rand_uniform<double>({4, 8}, 1, -1.0, 1.0));
  const Var<double> w = param(randn<double>({8, 3}, 2));
  backward(sum(tanh(matmul(x, w))));
  // d/dw sum(tanh(x·w)) = xᵀ·(1 - tanh²(x·w)), one entry checked by hand.
  double expected = 0;
  for (int i = 0; i < 4; ++i) {
    double z = 0;
    for (int k = 0; k < 8; ++k) z += x.value()(i, k) * w.value()(k, 0);
    expected += x.value()(i, 0) * (1 - std::tanh(z) * std::tanh(z));
  }
  const double got = w.grad()(0, 0);
  std::printf("tapegrad %s (%d.%d.%d), CUDA backend: %s\n", TAPEGRAD_VERSION_STRING, TAPEGRAD_VERSION_MAJOR,
              TAPEGRAD_VERSION_MINOR, TAPEGRAD_VERSION_PATCH, cuda::enabled ? "yes" : "no");
  std::printf("dw[0][0] = %.12f, by hand %.12f\n", got, expected);
  return std::abs(got - expected) < 1e-12 ? 0 : 1;
}

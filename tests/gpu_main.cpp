// main() of the GPU test binaries: without a usable CUDA device they exit 77, which Meson reports as SKIP. They compare
// fp8 ops with the CPU's on small blocks, so every size is quantized (the size policy has a test of its own).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "tapegrad/cuda/settings.hpp"
#include "tapegrad/tensor/gpu/device.hpp"

int main(int argc, char** argv) {
  if (tapegrad::cuda::device_count() == 0) {
    std::puts("no CUDA device visible: skipping the GPU tests");
    return 77;
  }
  tapegrad::cuda::set_fp8_dispatch(tapegrad::cuda::Fp8Dispatch::always);
  doctest::Context context(argc, argv);
  return context.run();
}

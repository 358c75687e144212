// main() of the GPU test binaries: without a usable CUDA device they exit 77, which Meson reports as SKIP.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "tapegrad/tensor/gpu/device.hpp"

int main(int argc, char** argv) {
  if (tapegrad::cuda::device_count() == 0) {
    std::puts("no CUDA device visible: skipping the GPU tests");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}

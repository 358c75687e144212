#include <doctest/doctest.h>

#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/gpu/device.hpp"

using namespace tapegrad;

TEST_CASE("the first CUDA device describes itself with its compute capability") {
  CHECK(cuda::device_description(0).find("(sm_") != std::string::npos);
}

TEST_CASE("asking for a CUDA device that does not exist throws naming it") {
  const int count = cuda::device_count();
  CHECK_THROWS_WITH_AS(cuda::device_description(count),
                       doctest::Contains(("cuda: device cuda:" + std::to_string(count) + " does not exist").c_str()),
                       Error);
}

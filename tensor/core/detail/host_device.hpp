// TAPEGRAD_HOST_DEVICE marks plain C++ functions that the CPU code and the CUDA kernels both compile, so that a formula
// written once gives the same arithmetic on every device (tensor/core/detail/philox.hpp,
// tensor/core/detail/random_draws.hpp, cuda/detail/update_rules.hpp). Outside nvcc it expands to nothing.
#pragma once

#if defined(__CUDACC__)
#define TAPEGRAD_HOST_DEVICE __host__ __device__
#else
#define TAPEGRAD_HOST_DEVICE
#endif

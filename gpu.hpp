// The GPU side of tapegrad's public API, beside tapegrad.hpp: which devices there are, streams, memory statistics,
// CUDA graphs, and the process-wide kernel choices (TF32, GEMM autotuning, elementwise kernels). In a build without
// CUDA these are declared but not defined: use them where `tapegrad::cuda::enabled` holds.
#pragma once

#include "tapegrad/cuda/settings.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"
#include "tapegrad/tensor/gpu/device.hpp"
#include "tapegrad/tensor/gpu/graph.hpp"
#include "tapegrad/tensor/gpu/memory.hpp"

// cuDNN, loaded at run time (dlopen) the first time fused attention asks for it: tapegrad needs it neither to link
// nor to run, and runs its own kernels where it is missing. Only the backend (graph) API is used
// (cuda/cudnn_graph.hpp builds on these entry points).
#pragma once

#include <cudnn_graph.h>

#include <string>

namespace tapegrad::cuda::cudnn {

// The entry points tapegrad calls, found in the loaded library.
struct Api {
  decltype(&cudnnGetVersion) version;
  decltype(&cudnnGetErrorString) error_string;
  decltype(&cudnnGetLastErrorString) last_error;
  decltype(&cudnnCreate) create;
  decltype(&cudnnSetStream) set_stream;
  decltype(&cudnnBackendCreateDescriptor) create_descriptor;
  decltype(&cudnnBackendDestroyDescriptor) destroy_descriptor;
  decltype(&cudnnBackendSetAttribute) set_attribute;
  decltype(&cudnnBackendGetAttribute) get_attribute;
  decltype(&cudnnBackendFinalize) finalize;
  decltype(&cudnnBackendExecute) execute;
};

// The oldest cuDNN taken: the first whose fused attention engines take any sequence length with a bottom-right mask.
inline constexpr std::size_t oldest_version = 90600;

// The library, loaded on first use (thread-safe): the path in TAPEGRAD_CUDNN if set, else libcudnn.so.9 as the
// dynamic linker finds it, else the one the build found. Null when none loads, a symbol is missing or it is older
// than oldest_version; unavailable() then says why.
const Api* api();
const std::string& unavailable();

// cuDNN's handle of `device` (whose current stream execution sets), created on first use and never destroyed, as
// cuBLASLt's are.
cudnnHandle_t handle(int device);

// cuDNN's name of `status` and its last error message.
std::string describe(cudnnStatus_t status);

}  // namespace tapegrad::cuda::cudnn

// Whether this build compiled the CUDA backend. Ops call the launchers of cuda/ only inside
// `if constexpr (cuda::enabled)`: in a build without CUDA the launchers are declared but not defined, and a
// discarded branch needs no definition. (Such a build has no device tensors: allocating one throws.)
#pragma once

namespace tapegrad::cuda {

#ifdef TAPEGRAD_HAVE_CUDA
inline constexpr bool enabled = true;
#else
inline constexpr bool enabled = false;
#endif

}  // namespace tapegrad::cuda

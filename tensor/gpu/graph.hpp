// CUDA graphs: GPU work recorded once and replayed with one launch, for steps whose kernels are short enough that
// launching them costs more than running them (a layernorm_mlp forward and backward on a few hundred rows). Plain C++
// (see tensor/gpu/backend.hpp for how callers use it).
//
// Graph::capture(device, work) calls `work` with the device's current stream capturing: every kernel, copy and cuBLASLt
// product `work` queues on the device is recorded, none runs. The device memory `work` allocates comes from the graph's
// own memory (tensor/gpu/detail/capture_memory.hpp), so each replay uses the same addresses: a tensor `work` creates
// and that outlives it (an output, a gradient) holds, after each replay(), that replay's values. Memory from before the
// capture that `work` frees stays allocated for the graph's life (the recorded kernels may read it); memory the graph
// allocated stays until the graph and every tensor in it are gone.
//
// What `work` must not do (as with CUDA graphs elsewhere): wait for the device or read device memory on the host (a
// copy to the host, synchronize, an item() check), or use another stream or device. Run it once uncaptured first: the
// elementwise kernels made by NVRTC and cuBLASLt's algorithms are then chosen (a GEMM first seen during capture takes
// cuBLASLt's heuristic choice, never autotuning). A refused call throws tapegrad::Error naming it, the capture ends,
// and the stream is usable again.
#pragma once

#include <functional>
#include <memory>

namespace tapegrad::cuda {

class Graph {
 public:
  static Graph capture(int device, const std::function<void()>& work);
  // Queues the recorded work on the device's current stream; nothing waits for it.
  void replay() const;
  int device() const;

 private:
  struct State;
  explicit Graph(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

// Whether the device's current stream is being captured (by Graph::capture or by CUDA's own calls): work that waits
// for the device cannot run there then.
bool capturing(int device);

}  // namespace tapegrad::cuda
